"""A peer's move of a running tunnel, as a hostile peer would send it: a move is acted on only
when it comes from the peer that shares the tunnel, signed, sealed, fresh and first seen; a move
this side cannot agree to says nothing of its ratings and changes nothing; one it agrees to loads
the choice beside the running SA and goes back to the old proposals when given up or never
confirmed. Site B's app in-process, its gateway a fake charon speaking VICI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.adapters.agent.crypto import CRYPTO, KeyPair, PublicKeys
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.adapters.peering import peering_keys
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import AgentRejected, Kind, b64e, canonical
from app.domain.errors import Conflict, GatewayError, QossError, TunnelVerificationFailed, UnsupportedProtection
from app.domain.ports import UnitOfWorkFactory
from app.domain.tunnels import PeerEnd, TunnelRecord, TunnelState
from app.services.peering import Peering, PeeringConfig
from app.services.rekey import Rekeyer, assess_one
from app.services.tunnels import negotiate_tunnel
from app.settings import Settings
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.peering import site_b_app
from tests.fixtures.tunnel_records import unit_on

pytestmark = pytest.mark.anyio

_A, _C = KeyPair.generate("site-a"), KeyPair.generate("site-c")
#: What site-a's tunnel runs on at B, and what B's table ranks first for it.
_ASK = {"confidentiality": 8, "integrity": 8}


def _tunnel(uow: Any, tunnel_id: str, site: str) -> TunnelRecord:
    gateway = uow.gateways.get("gw-b")
    result = negotiate_tunnel(uow=uow, inputs={"min_levels": _ASK}, initiator=gateway, responder=None,
                              default_table="standards-2026", pinned=["aes128gcm16", "prfsha256", "x25519"])
    return TunnelRecord(id=tunnel_id, initiator="gw-b", responder=None, local_ts=("10.2.0.0/24",),
                        remote_ts=("10.1.0.1/32",), state=TunnelState.UP, negotiation=result.as_dict(),
                        peer=PeerEnd(address="10.99.0.1", identity=f"{tunnel_id}.gw-a",
                                     local_identity=f"{tunnel_id}.gw-b", site=site, gateway=None, role="responder"),
                        provenance={"request": {"min_levels": _ASK}, "peer": site, "offered": 1})


@pytest.fixture
async def site_b(settings: Settings, admin_token: str, tmp_path: Path
                 ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, FakeCharon, dict[str, Any]]]:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        algorithms = frozenset({"aes128gcm16", "aes256gcm16", "chacha20poly1305", "x25519", "prfsha256", "ppk"})
        headers = {"Authorization": f"Bearer {admin_token}"}
        async with (site_b_app(settings, vici_factory=_vici, vici_socket=str(fake.socket_path), algorithms=algorithms,
                               rekey=False) as app,
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test",
                                      headers=headers) as c):
            for name, keys in (("site-a", _A), ("site-c", _C)):
                r = await c.post("/v1/peers", json={
                    "name": name, "url": "http://127.0.0.1:9", "sign_public_key": b64e(keys.public.sign),
                    "kem_public_key": b64e(keys.public.kem), "gateways": ["gw-b"], "networks": ["10.2.0.0/24"],
                    "min_levels": {"confidentiality": 5}})
                assert r.status_code == 201, r.text
            with unit_on(settings.database_url) as uow:
                uow.tunnels.add(_tunnel(uow, "t-a", "site-a"))
                uow.tunnels.add(_tunnel(uow, "t-c", "site-c"))
                uow.commit()
            identity = (await c.get("/v1/peering/identity")).json()
            yield app, c, fake, identity


def _vici(path: str) -> ViciGateway:
    """gw-b's charon: the fake one, reached over its socket."""
    return ViciGateway(path, 5.0, pool=None)


@contextlib.contextmanager
def _units(settings: Settings) -> Iterator[UnitOfWorkFactory]:
    """Units of work on site B's database, its engine disposed after."""
    engine = make_engine(settings.database_url)
    try:
        yield sql_units_of_work(make_session_factory(engine))
    finally:
        engine.dispose()


def _peering(units: UnitOfWorkFactory, link: Any) -> Peering:
    """Site B's peering on ``units``, reaching its peers through ``link``."""
    return Peering(config=PeeringConfig(name="site-b", timeout=3, default_table="standards-2026"), units=units,
                   vici=_vici, link=link, keys=peering_keys, crypto=CRYPTO)


def _move(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"tunnel_id": "t-a", "sender": "site-a", "timestamp": int(time.time()),
                           "nonce": secrets.token_urlsafe(18),
                           "suites": ["aes256gcm16-x25519", "chacha20poly1305-x25519"],
                           "ikes": ["aes256gcm16-prfsha256-x25519"]}
    doc.update(changes)
    return doc


def _sealed(identity: dict[str, Any], doc: dict[str, Any], *, keys: KeyPair = _A, kind: Kind = Kind.PEER_MOVE) -> bytes:
    kem = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem
    return keys.seal(kind=kind, to="site-b", body=canonical(doc), recipient=kem)


async def _post(c: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await c.post("/v1/peering/messages", content=data, headers={"content-type": "application/json",
                                                                        "Authorization": ""})


async def _esp(c: httpx.AsyncClient, tunnel_id: str) -> str:
    return str((await c.get(f"/v1/tunnels/{tunnel_id}")).json()["proposals"]["esp"])


async def test_a_peer_may_not_move_a_tunnel_it_does_not_share(site_b: Any) -> None:
    _, c, fake, identity = site_b
    before = await _esp(c, "t-c")
    r = await _post(c, _sealed(identity, _move(tunnel_id="t-c")))  # site-c's tunnel, moved by site-a
    assert r.status_code == 404, r.text
    r = await _post(c, _sealed(identity, _move(tunnel_id="nothere")))
    assert r.status_code == 404, r.text
    assert await _esp(c, "t-c") == before
    assert fake.count("load-conn") == 0


@pytest.mark.parametrize("change", [
    {"timestamp": int(time.time()) - 600},  # not fresh
    {"sender": "site-c"},  # another peer's name inside
])
async def test_a_move_not_fresh_or_under_another_name_is_refused_with_nothing_loaded(
        site_b: Any, change: dict[str, Any]) -> None:
    _, c, fake, identity = site_b
    r = await _post(c, _sealed(identity, _move(**change)))
    assert r.status_code == 403, r.text
    assert fake.count("load-conn") == 0


async def test_a_move_signed_by_another_key_is_refused(site_b: Any) -> None:
    _, c, fake, identity = site_b
    r = await _post(c, _sealed(identity, _move(), keys=KeyPair.generate("site-a")))
    assert r.status_code == 403, r.text
    assert fake.count("load-conn") == 0


async def test_a_move_nothing_of_which_this_side_accepts_is_refused_saying_nothing_of_its_ratings(
        site_b: Any) -> None:
    _, c, fake, identity = site_b
    before = await _esp(c, "t-a")
    data = _sealed(identity, _move(suites=["aes128gcm16-x25519"], ikes=["aes128gcm16-prfsha256-x25519"]))
    revision = (await c.get("/v1/rating-tables/standards-2026")).json()["revision"]
    r = await c.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16", headers={"If-Match": f'"{revision}"'},
                      json={"confidentiality": 4, "reason": "this side's own judgement"})
    assert r.status_code == 200, r.text
    r = await _post(c, data)
    assert r.status_code == 409, r.text
    assert r.json() == {"error": "PeerNoFeasibleSuite",
                        "detail": "peer site-b: none of the 1 suites offered meets this side's requirements"}
    assert (await _post(c, data)).status_code == 403  # the same message again: a replay
    assert fake.count("load-conn") == 0
    assert await _esp(c, "t-a") == before


async def test_a_move_agreed_to_is_loaded_beside_the_running_sa_and_undone_when_given_up(site_b: Any) -> None:
    _, c, fake, identity = site_b
    before = await _esp(c, "t-a")
    r = await _post(c, _sealed(identity, _move()))
    assert r.status_code == 200, r.text
    kind, body, _ = _A.open_sealed(r.content, kinds=[Kind.PEER_MOVE_ANSWER])
    assert kind is Kind.PEER_MOVE_ANSWER
    answer = json.loads(body)
    assert set(answer) == {"tunnel_id", "sender", "timestamp", "nonce", "chosen", "ike", "expires"}
    chosen = _move()["suites"][answer["chosen"]]
    loaded = fake.messages("load-conn")
    assert len(loaded) == 1
    ((name, conn),) = loaded[0].items()
    assert conn["children"][name]["esp_proposals"] == [chosen]
    record = (await c.get("/v1/tunnels/t-a")).json()
    assert record["proposals"]["esp"] == before  # not moved until confirmed
    assert "moving" in record["provenance"]
    again = await _post(c, _sealed(identity, _move()))
    assert again.status_code == 403, again.text  # one move at a time
    given_up = {"tunnel_id": "t-a", "sender": "site-a", "timestamp": int(time.time()),
                "nonce": secrets.token_urlsafe(18), "up": False}
    r = await _post(c, _sealed(identity, given_up, kind=Kind.PEER_MOVED))
    assert r.status_code == 200, r.text
    loaded = fake.messages("load-conn")
    assert len(loaded) == 2
    ((name, conn),) = loaded[1].items()
    assert conn["children"][name]["esp_proposals"] == [before]  # the old proposals, back
    record = (await c.get("/v1/tunnels/t-a")).json()
    assert record["proposals"]["esp"] == before
    assert record["state"] == "up"
    assert "moving" not in record["provenance"]


async def test_a_move_never_confirmed_goes_back_to_the_old_proposals_by_itself(site_b: Any) -> None:
    app, c, fake, identity = site_b
    before = await _esp(c, "t-a")
    assert (await _post(c, _sealed(identity, _move()))).status_code == 200
    peering = app.state.runtime.peering
    peering._moves._clock = lambda: time.time() + 60  # past the move's deadline; the sweep runs every second
    for _ in range(100):  # at most 10 s
        if len(fake.messages("load-conn")) == 2:
            break
        await asyncio.sleep(0.1)
    ((name, conn),) = fake.messages("load-conn")[1].items()
    assert conn["children"][name]["esp_proposals"] == [before]
    record = (await c.get("/v1/tunnels/t-a")).json()
    assert "moving" not in record["provenance"]
    assert record["proposals"]["esp"] == before


class _Answers:
    """A peer as this side's link to it: opens what B sends, answers each move with its first suite
    and IKE proposal and ``ppk`` (None: none), sealed hybrid (``hybrid``) or with X25519 alone, and
    acknowledges the rest; keeps every message it got."""

    def __init__(self, keys: KeyPair, name: str, identity: dict[str, Any], *, hybrid: bool = False,
                 ppk: tuple[str, bytes] | None = None) -> None:
        b = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"],
                                 identity["mlkem_public_key"] if hybrid else None)
        self.keys, self.name = keys, name
        self.b_kem, self.b_mlkem = b.kem, b.mlkem
        self.ppk = ppk
        self.got: list[tuple[Kind, dict[str, Any]]] = []

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        kind, body, _ = self.keys.open_sealed(data, kinds=[Kind.PEER_MOVE, Kind.PEER_MOVED, Kind.PEER_TEARDOWN])
        doc = json.loads(body)
        self.got.append((kind, doc))
        head = {"tunnel_id": doc["tunnel_id"], "sender": self.name, "timestamp": int(time.time()),
                "nonce": secrets.token_urlsafe(18)}
        if kind is not Kind.PEER_MOVE:
            return 200, self.keys.seal(kind=Kind.PEER_ACK, to="site-b", body=canonical(head), recipient=self.b_kem)
        answer = {**head, "chosen": 0, "ike": 0, "expires": int(time.time()) + 10,
                  **({"ppk_id": self.ppk[0], "ppk": self.ppk[1].hex()} if self.ppk is not None else {})}
        return 200, self.keys.seal(kind=Kind.PEER_MOVE_ANSWER, to="site-b", body=canonical(answer),
                                   recipient=self.b_kem, recipient_mlkem=self.b_mlkem,
                                   post_quantum=self.b_mlkem is not None)


@pytest.mark.parametrize("initiate", ["refused", "no new SA"])
async def test_a_move_that_fails_on_this_side_goes_back_on_both_and_changes_no_record(
        site_b: Any, settings: Settings, initiate: str) -> None:
    _, c, fake, identity = site_b
    before = await _esp(c, "t-a")
    if initiate == "refused":
        fake.fail("initiate", "establishing CHILD_SA failed")
    # else: charon says yes, but no new CHILD_SA shows: this side's check refuses it.
    site_a = _Answers(_A, "site-a", identity)
    with _units(settings) as units, pytest.raises((GatewayError, TunnelVerificationFailed)):
        await asyncio.to_thread(_peering(units, site_a).move_tunnel, tunnel_id="t-a")
    assert [k for k, _ in site_a.got] == [Kind.PEER_MOVE, Kind.PEER_MOVED]
    assert site_a.got[1][1]["up"] is False  # A was told to go back
    assert set(site_a.got[0][1]) == {"tunnel_id", "sender", "timestamp", "nonce", "suites", "ikes"}  # ranks only
    loads = [conn["children"][name]["esp_proposals"] for m in fake.messages("load-conn") for name, conn in m.items()]
    assert loads == [[site_a.got[0][1]["suites"][0]], [before]]  # the move's choice, then the old one back
    record = (await c.get("/v1/tunnels/t-a")).json()
    assert (record["state"], record["proposals"]["esp"]) == ("up", before)


class _Mover:
    """Stands in for the peering: records which tunnels the rekeyer asks it to move."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def move_tunnel(self, *, tunnel_id: str) -> Any:
        self.asked.append(tunnel_id)
        raise GatewayError("not moved in this test")


async def test_the_rekeyer_moves_a_peered_tunnel_only_below_this_sides_minimums(
        site_b: Any, settings: Settings) -> None:
    _, c, _, _ = site_b
    revision = (await c.get("/v1/rating-tables/standards-2026")).json()["revision"]
    with _units(settings) as units:
        mover = _Mover()
        rekeyer = Rekeyer(units=units, vici=_vici, default_table="standards-2026", cheaper="now", peering=mover)
        try:
            with units() as uow:  # t-c now runs on a dearer suite than this side would choose: still good enough
                record = uow.tunnels.get("t-c")
                gateway = uow.gateways.get("gw-b")
                dearer = negotiate_tunnel(uow=uow, inputs={"min_levels": _ASK}, initiator=gateway, responder=None,
                                          default_table="standards-2026", pinned=["aes256gcm16", "prfsha256", "x25519"])
                uow.tunnels.set_negotiation("t-c", dearer.as_dict(), record.provenance, "")
                uow.commit()
            impacts = {i.tunnel: i for i in await asyncio.to_thread(rekeyer.run_once, "test")}
            assert impacts["t-c"].kind in ("cheaper", "different")
            assert impacts["t-c"].peered
            assert mover.asked == []  # never moved for a cheaper choice alone
            r = await c.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16",
                              headers={"If-Match": f'"{revision}"'},
                              json={"confidentiality": 4, "reason": "this side's own judgement"})
            assert r.status_code == 200, r.text
            impacts = {i.tunnel: i for i in await asyncio.to_thread(rekeyer.run_once, "test")}
            assert impacts["t-a"].kind == "noncompliant"
            assert mover.asked == ["t-a"]
            record_a = (await c.get("/v1/tunnels/t-a")).json()
            assert record_a["state"] == "noncompliant"  # not moved: as it was, with the reason
            assert "not moved: not moved in this test" in record_a["detail"]
        finally:
            rekeyer.stop()


def _asking_for_post_quantum(units: Any, tunnel_id: str) -> None:
    """``tunnel_id`` as if its request now asked for post-quantum protection (an edit raised it)."""
    with units() as uow:
        record = uow.tunnels.get(tunnel_id)
        asks = {**_ASK, "post_quantum": 1}
        uow.tunnels.set_negotiation(tunnel_id, record.negotiation, {**(record.provenance or {}),
                                                                    "request": {"min_levels": asks}}, "")
        uow.commit()


async def test_a_move_onto_a_ppk_with_a_peer_without_an_mlkem_key_is_refused_before_anything_is_sent(
        site_b: Any, settings: Settings) -> None:
    _, _, fake, identity = site_b
    site_a = _Answers(_A, "site-a", identity)
    with _units(settings) as units:
        _asking_for_post_quantum(units, "t-a")
        with pytest.raises(UnsupportedProtection, match="site-a registered no ML-KEM-768 key"):
            await asyncio.to_thread(_peering(units, site_a).move_tunnel, tunnel_id="t-a")
    assert site_a.got == []
    assert fake.count("load-conn") == 0


_D = KeyPair.generate("site-d")


async def _site_d(c: httpx.AsyncClient, settings: Settings) -> None:
    """Site D registered with its ML-KEM-768 key, and its tunnel t-d at B."""
    r = await c.post("/v1/peers", json={"name": "site-d", "url": "http://127.0.0.1:9", **_D.public.as_dict(),
                                        "gateways": ["gw-b"], "networks": ["10.2.0.0/24"],
                                        "min_levels": {"confidentiality": 5}})
    assert r.status_code == 201, r.text
    with unit_on(settings.database_url) as uow:
        uow.tunnels.add(_tunnel(uow, "t-d", "site-d"))
        uow.commit()


@pytest.mark.parametrize(("ppk", "hybrid", "says"), [
    (None, True, "answered without the post-quantum preshared key the move needs"),
    (("qoss-ppk-" + "cd" * 12, b"\x05" * 32), False, "its answer does not check out"),
])
async def test_a_move_onto_a_ppk_takes_no_answer_without_one_or_not_sealed_hybrid(
        site_b: Any, settings: Settings, ppk: tuple[str, bytes] | None, hybrid: bool, says: str) -> None:
    _, c, fake, identity = site_b
    await _site_d(c, settings)
    before = await _esp(c, "t-d")
    site_d = _Answers(_D, "site-d", identity, hybrid=hybrid, ppk=ppk)
    with _units(settings) as units:
        _asking_for_post_quantum(units, "t-d")
        with pytest.raises(QossError, match=says):
            await asyncio.to_thread(_peering(units, site_d).move_tunnel, tunnel_id="t-d")
    assert site_d.got[0][1]["post_quantum"] == ["ppk"]  # the move asked for one
    if ppk is None:  # an answer that checked out: D is told the move is given up
        assert [(k, d.get("up")) for k, d in site_d.got[1:]] == [(Kind.PEER_MOVED, False)]
    assert fake.count("load-conn") == 0
    assert fake.count("load-shared") == 0
    assert await _esp(c, "t-d") == before


async def test_a_move_asking_for_a_ppk_gets_a_new_one_sealed_hybrid_and_loaded_with_the_new_conn(
        site_b: Any, settings: Settings) -> None:
    _, c, fake, identity = site_b
    await _site_d(c, settings)
    before = await _esp(c, "t-d")
    r = await _post(c, _sealed(identity, _move(tunnel_id="t-d", sender="site-d", post_quantum=["ppk"]), keys=_D))
    assert r.status_code == 200, r.text
    # Only ever sealed hybrid (one sealed with X25519 alone would be refused here): the key is inside.
    _, body, _ = _D.open_sealed(r.content, kinds=[Kind.PEER_MOVE_ANSWER], hybrid_only=True)
    answer = json.loads(body)
    assert answer["ppk_id"].startswith("qoss-ppk-")
    key = bytes.fromhex(answer["ppk"])
    assert len(key) == 32
    (secret,) = [m for m in fake.messages("load-shared") if m.get("type") == "PPK"]
    assert secret["owners"] == [answer["ppk_id"]]
    data = secret["data"]  # the fake charon's decoding of the raw bytes
    assert (data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data) == key
    ((name, conn),) = fake.messages("load-conn")[0].items()
    assert secret["id"] == f"{name}-ppk"
    assert (conn["ppk_id"], conn["ppk_required"]) == (answer["ppk_id"], "yes")
    assert conn["children"][name]["esp_proposals"] == [_move()["suites"][answer["chosen"]]]
    record = (await c.get("/v1/tunnels/t-d")).json()
    assert record["proposals"]["esp"] == before  # not moved until confirmed
    assert record["provenance"]["moving"]["ppk_id"] == answer["ppk_id"]  # its id, never the key
    assert answer["ppk"] not in json.dumps(record)
    given_up = {"tunnel_id": "t-d", "sender": "site-d", "timestamp": int(time.time()),
                "nonce": secrets.token_urlsafe(18), "up": False}
    assert (await _post(c, _sealed(identity, given_up, keys=_D, kind=Kind.PEER_MOVED))).status_code == 200
    ((name, conn),) = fake.messages("load-conn")[1].items()
    assert conn["children"][name]["esp_proposals"] == [before]  # the old proposals, without a PPK
    assert "ppk_id" not in conn
    assert fake.messages("unload-shared") == [{"id": f"{name}-ppk"}]  # the old suite had none: the key goes


class _Crossing:
    """A peer that moves the same tunnel at the moment this side's move reaches it: it sends its own
    move to this side first (``peering.receive``, as this side's route would), then answers this side's
    move as its name says it should (the lesser name's move goes on, the other is refused)."""

    def __init__(self, keys: KeyPair, name: str, b_kem: bytes, tunnel_id: str) -> None:
        self.keys, self.name, self.b_kem, self.tunnel_id = keys, name, b_kem, tunnel_id
        self.peering: Peering | None = None
        self.theirs: str = ""  # what became of this peer's own move at B

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        assert self.peering is not None
        kind, _, _ = self.keys.open_sealed(data, kinds=[Kind.PEER_MOVE, Kind.PEER_MOVED, Kind.PEER_TEARDOWN])
        head = {"tunnel_id": self.tunnel_id, "sender": self.name, "timestamp": int(time.time()),
                "nonce": secrets.token_urlsafe(18)}
        if kind is not Kind.PEER_MOVE:
            return 200, self.keys.seal(kind=Kind.PEER_ACK, to="site-b", body=canonical(head), recipient=self.b_kem)
        own = {**head, "suites": ["chacha20poly1305-x25519"], "ikes": ["aes256gcm16-prfsha256-x25519"]}
        try:
            self.peering.receive(self.keys.seal(kind=Kind.PEER_MOVE, to="site-b", body=canonical(own),
                                                recipient=self.b_kem))
            self.theirs = "answered"
        except AgentRejected:
            self.theirs = "refused"
        if self.name < "site-b":  # this peer's own move goes on: it refuses B's
            return 403, b'{"error": "AgentRejected", "detail": "the request was rejected"}'
        answer = {**head, "chosen": 0, "ike": 0, "expires": int(time.time()) + 10}
        return 200, self.keys.seal(kind=Kind.PEER_MOVE_ANSWER, to="site-b", body=canonical(answer),
                                   recipient=self.b_kem)


@pytest.mark.parametrize(("name", "keys", "tunnel_id", "goes_on"), [
    ("site-a", _A, "t-a", "site-a's"),  # site-a < site-b: site-a's move goes on, B's is refused
    ("site-c", _C, "t-c", "B's"),  # site-b < site-c: B's goes on, site-c's is refused
])
async def test_when_both_sides_move_a_tunnel_at_once_the_lesser_names_move_goes_on(
        site_b: Any, settings: Settings, name: str, keys: KeyPair, tunnel_id: str, goes_on: str) -> None:
    _, c, fake, identity = site_b
    crossing = _Crossing(keys, name, PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem,
                         tunnel_id)
    with _units(settings) as units:
        peering = crossing.peering = _peering(units, crossing)
        with pytest.raises(QossError):  # B's move: refused by site-a, or (the fake charon) not up on B's side
            await asyncio.to_thread(peering.move_tunnel, tunnel_id=tunnel_id)
        record = (await c.get(f"/v1/tunnels/{tunnel_id}")).json()
        if goes_on == "site-a's":
            assert crossing.theirs == "answered"
            assert fake.count("load-conn") == 1  # site-a's choice, loaded by B as the side asked; B loaded nothing
            assert "moving" in record["provenance"]
            with pytest.raises(Conflict, match="site-a is moving the tunnel itself"):  # and B does not start one
                await asyncio.to_thread(peering.move_tunnel, tunnel_id=tunnel_id)
        else:
            assert crossing.theirs == "refused"
            assert "moving" not in record["provenance"]


async def test_an_edits_preview_moves_a_peered_tunnel_onto_a_ppk_unless_the_peer_has_no_mlkem_key(
        site_b: Any, settings: Settings) -> None:
    _, c, _, _ = site_b
    await _site_d(c, settings)
    with _units(settings) as units:
        for tunnel_id in ("t-a", "t-d"):
            _asking_for_post_quantum(units, tunnel_id)
        with units() as uow:
            with_mlkem = assess_one(uow, uow.tunnels.get("t-d"), default_table="standards-2026")
            without = assess_one(uow, uow.tunnels.get("t-a"), default_table="standards-2026")
    assert with_mlkem.kind == "noncompliant"
    assert with_mlkem.result is not None
    assert with_mlkem.result.suite.post_quantum == "ppk"  # it follows: the move asks site-d for a PPK
    assert without.kind == "noncompliant"
    assert without.result is None
    assert without.reason.startswith("it cannot follow: post_quantum: a preshared key may only cross to a peer")
    assert "site-a registered no ML-KEM-768 key" in without.reason


async def test_an_offer_asking_for_a_ppk_gets_one_whatever_this_sides_own_minimum(
        site_b: Any, settings: Settings) -> None:
    _, c, fake, identity = site_b
    await _site_d(c, settings)  # its peering asks for no post-quantum protection here
    offer = {"tunnel_id": "new123", "sender": "site-d", "timestamp": int(time.time()),
             "nonce": secrets.token_urlsafe(18), "gateway": "gw-b",
             "initiator": {"address": "10.99.0.4", "identity": "new123.gw-d", "networks": ["10.4.0.1/32"]},
             "networks": [], "min_levels": _ASK, "suites": ["aes128gcm16-x25519"],
             "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200],
             "post_quantum": ["ppk"]}
    r = await _post(c, _sealed(identity, offer, keys=_D, kind=Kind.PEER_OFFER))
    assert r.status_code == 200, r.text
    _, body, _ = _D.open_sealed(r.content, kinds=[Kind.PEER_ANSWER], hybrid_only=True)
    answer = json.loads(body)
    assert len(bytes.fromhex(answer["ppk"])) == 32
    ((name, conn),) = fake.messages("load-conn")[0].items()
    assert (conn["ppk_id"], conn["ppk_required"]) == (answer["ppk_id"], "yes")
    assert {m["id"] for m in fake.messages("load-shared") if m.get("type") == "PPK"} == {f"{name}-ppk"}
    record = (await c.get("/v1/tunnels/new123")).json()
    assert record["suite"]["post_quantum"] == "ppk"
    assert record["provenance"]["ppk_id"] == answer["ppk_id"]
