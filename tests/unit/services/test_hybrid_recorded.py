"""A recorded run of the exchanges that can carry a tunnel's secrets between qoss parties, and
what its X25519 private keys alone give away: nothing.

Recorded: Host's endorsement to Target and Target's answer (the tunnel's session key inside),
through the real Host, Target and client roles on the fakes; a peer's offer and the peer's answer
(the tunnel's key inside), sealed and opened by peering's own functions. Kept with the recording:
each recipient's X25519 and ML-KEM-768 private keys. With the X25519 keys alone nothing opens;
with both halves each message opens to its secret. ``tests/fixtures/hybrid_recorded.json`` is
such a recording made once (``python -m tests.unit.services.test_hybrid_recorded`` makes another);
the same checks run on a fresh recording each time."""

from __future__ import annotations

import json
import secrets
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import (
    MAX_RESPONSE_WIRE_BYTES,
    AgentRejected,
    Kind,
    RequestInfo,
    b64d,
    b64e,
    decode_canonical,
)
from app.domain.agent.messages import Endorsement, Response
from app.domain.peering import Answer, Offer, Peer
from app.domain.policies import Levels
from app.domain.tunnels import keywords_from_charon
from app.services.agent.client import AgentClient
from app.services.agent.config import AgentConfig, ClientConfig, HostRole, Party, TargetRole
from app.services.agent.host import HostAgent
from app.services.agent.target import TargetAgent
from app.services.peering.messages import open_message, seal_message
from tests.fakes.agent_store import FakeAgentStore
from tests.fakes.fake_charon import FakeCharon
from tests.fakes.uow import FakeDatabase

RECORDING = Path(__file__).parents[2] / "fixtures" / "hybrid_recorded.json"
#: (message, recipient, kinds it is opened as)
MESSAGES = (("endorse", "far", (Kind.ENDORSE,)), ("answer", "alice", (Kind.RESPONSE,)),
            ("offer", "site-b", (Kind.PEER_OFFER,)), ("peer_answer", "site-a", (Kind.PEER_ANSWER,)))


class Keys:
    """A party's keys made from parts the recording keeps (X25519 and ML-KEM-768 private keys)."""

    def __init__(self, name: str) -> None:
        self.x25519, self.mlkem = X25519PrivateKey.generate(), MLKEM768PrivateKey.generate()
        self.pair = KeyPair(name, Ed25519PrivateKey.generate(), self.x25519, self.mlkem)

    def kept(self) -> dict[str, str]:
        return {"x25519": self.x25519.private_bytes_raw().hex(), "mlkem768": self.mlkem.private_bytes_raw().hex()}


def _gateway(path: str) -> ViciGateway:
    return ViciGateway(path, timeout=2.0)


def record_agent(database: FakeDatabase, tmp_path: Path, *, to_host_hybrid: bool = True
                 ) -> tuple[dict[str, Any], bytes]:
    """Alice connects to Target ``far`` through Host ``hq`` (two processes' worth of roles):
    the endorsement and the answer on the wire, the recipients' keys; and the session key alice got.
    ``to_host_hybrid`` false: alice seals her request to Host's X25519 key alone, as the browser's
    page does."""
    hq, far, alice = Keys("hq"), Keys("far"), Keys("alice")
    wires: dict[str, bytes] = {}
    with ExitStack() as stack:
        charon = stack.enter_context(FakeCharon(tmp_path / "target.vici"))
        client_charon = stack.enter_context(FakeCharon(tmp_path / "client.vici"))
        target = TargetAgent(
            config=AgentConfig(id="far", key_dir=tmp_path, target=TargetRole(
                hosts={"hq": Party(**hq.pair.public.as_dict())}, vici_socket=charon.socket_path,
                ike_address="10.99.0.3", protected=["10.3.0.1/32"], pool="10.3.8.0/29")),
            keys=far.pair, crypto=CRYPTO, store=FakeAgentStore(), units=database.unit, vici=_gateway,
            default_table="standards-2026")

        def post(url: str, wire: bytes) -> bytes:
            wires["endorse"] = wire
            wires["answer"] = target.handle(wire).answer
            return wires["answer"]

        host = HostAgent(config=AgentConfig(id="hq", key_dir=tmp_path, host=HostRole(
            targets={"far": Party(url="http://far.test", **far.pair.public.as_dict())})),
            keys=hq.pair, crypto=CRYPTO, store=FakeAgentStore(), post=post)
        host.enroll(user_id="alice", objectives=[3], **alice.pair.public.as_dict())
        client = AgentClient(
            config=ClientConfig(user="alice", key_dir=tmp_path, host={
                "id": "hq", "url": "http://127.0.0.1:9",
                **{k: v for k, v in hq.pair.public.as_dict().items() if to_host_hybrid or k != "mlkem_public_key"}},
                                targets={"far": Party(**far.pair.public.as_dict())},
                                vici_socket=client_charon.socket_path, state_dir=tmp_path / "state"),
            keys=alice.pair, crypto=CRYPTO, vici=_gateway(client_charon.socket_path), post=post)
        supports = tuple(sorted(keywords_from_charon(charon.algorithms)))
        request, wire = client.request(Kind.CONNECT, RequestInfo(target="far", supports=supports), 3)
        response = client.accept(host.handle(wire).answer, request)
    assert response.session_key is not None
    return ({"request": b64e(wire), "endorse": b64e(wires["endorse"]), "answer": b64e(wires["answer"]),
             "far": far.kept(), "alice": alice.kept()}, response.session_key)


def record_peers() -> tuple[dict[str, Any], bytes]:
    """Site A offers a tunnel to site B, B answers with the tunnel's key (as a post-quantum
    preshared key would travel: ``post_quantum``): both on the wire, the recipients' keys; and the key."""
    a, b = Keys("site-a"), Keys("site-b")

    def peer(keys: Keys) -> Peer:
        public = keys.pair.public
        return Peer(name=keys.pair.name, url="http://127.0.0.1:9", sign_key=public.sign, kem_key=public.kem,
                    mlkem_key=public.mlkem, gateways=("gw-b",), networks=("10.2.0.0/24",), min_levels=Levels())

    now = int(time.time())
    offer = Offer.from_dict({
        "tunnel_id": "abc123", "sender": "site-a", "timestamp": now, "nonce": secrets.token_urlsafe(18),
        "gateway": "gw-b", "initiator": {"address": "10.99.0.1", "identity": "abc123.gw-a",
                                         "networks": ["10.1.0.1/32"]},
        "networks": [], "min_levels": {"confidentiality": 5}, "suites": ["aes128gcm16-x25519"],
        "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]})
    offer_wire = seal_message(a.pair, peer(b), Kind.PEER_OFFER, offer.as_dict())
    got = open_message(offer_wire, keys=b.pair, crypto=CRYPTO, kinds=(Kind.PEER_OFFER,), find=lambda _: peer(a))
    assert Offer.from_dict(got.document) == offer
    psk = secrets.token_bytes(32)
    answer = Answer.from_dict({
        "tunnel_id": "abc123", "sender": "site-b", "timestamp": now, "nonce": secrets.token_urlsafe(18),
        "chosen": 0, "ike": 0, "responder": {"address": "10.99.0.2", "identity": "abc123.gw-b",
                                             "networks": ["10.2.0.0/24"]},
        "psk": psk.hex(), "expires": now + 30})
    answer_wire = seal_message(b.pair, peer(a), Kind.PEER_ANSWER, answer.as_dict(), post_quantum=True)
    back = open_message(answer_wire, keys=a.pair, crypto=CRYPTO, kinds=(Kind.PEER_ANSWER,), find=lambda _: peer(b),
                        sender="site-b", hybrid_only=True)
    assert Answer.from_dict(back.document).psk == psk
    return {"offer": b64e(offer_wire), "peer_answer": b64e(answer_wire),
            "site-b": b.kept(), "site-a": a.kept()}, psk


def _wire(recording: dict[str, Any], message: str) -> bytes:
    return b64d(recording[message], max_size=MAX_RESPONSE_WIRE_BYTES)


def _both_halves(recording: dict[str, Any], name: str) -> KeyPair:
    kept = recording[name]
    return KeyPair(name, Ed25519PrivateKey.generate(),
                   X25519PrivateKey.from_private_bytes(bytes.fromhex(kept["x25519"])),
                   MLKEM768PrivateKey.from_seed_bytes(bytes.fromhex(kept["mlkem768"])))


def _x25519_alone(recording: dict[str, Any], name: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes.fromhex(recording[name]["x25519"]))


def check_x25519_alone_opens_nothing(recording: dict[str, Any]) -> None:
    for message, recipient, kinds in MESSAGES:
        data = _wire(recording, message)
        header = decode_canonical(data, max_size=MAX_RESPONSE_WIRE_BYTES)
        assert header["v"] == 2, f"{message} is sealed hybrid"
        x25519 = _x25519_alone(recording, recipient)
        with pytest.raises(AgentRejected):  # the X25519 key as the recipient's whole key
            KeyPair(recipient, Ed25519PrivateKey.generate(), x25519).open_sealed(data, kinds=kinds)
        with pytest.raises(AgentRejected):  # the X25519 key beside any ML-KEM-768 key but the recipient's
            KeyPair(recipient, Ed25519PrivateKey.generate(), x25519, MLKEM768PrivateKey.generate()).open_sealed(
                data, kinds=kinds)
        relabelled = data.replace(b'"v":2', b'"v":1')
        with pytest.raises(AgentRejected):  # read as an X25519-only seal
            KeyPair(recipient, Ed25519PrivateKey.generate(), x25519).open_sealed(relabelled, kinds=kinds)


def check_both_halves_open(recording: dict[str, Any]) -> tuple[bytes, bytes]:
    """(the session key in Target's answer, the tunnel key in the peer's answer), opened with both halves."""
    _, body, _ = _both_halves(recording, "far").open_sealed(_wire(recording, "endorse"), kinds=[Kind.ENDORSE])
    assert Endorsement.parse(body).user.user_id == "alice"
    _, body, _ = _both_halves(recording, "alice").open_sealed(_wire(recording, "answer"), kinds=[Kind.RESPONSE],
                                                               hybrid_only=True)
    session_key = Response.parse(body, kind=Kind.RESPONSE).session_key
    assert session_key is not None
    _, body, _ = _both_halves(recording, "site-b").open_sealed(_wire(recording, "offer"), kinds=[Kind.PEER_OFFER])
    assert json.loads(body)["tunnel_id"] == "abc123"
    _, body, _ = _both_halves(recording, "site-a").open_sealed(_wire(recording, "peer_answer"),
                                                                kinds=[Kind.PEER_ANSWER], hybrid_only=True)
    return session_key, bytes.fromhex(json.loads(body)["psk"])


@pytest.fixture
def recording(database: FakeDatabase, tmp_path: Path) -> tuple[dict[str, Any], bytes, bytes]:
    agent, session_key = record_agent(database, tmp_path)
    peers, psk = record_peers()
    return {**agent, **peers}, session_key, psk


def test_a_fresh_recording_gives_nothing_to_the_x25519_keys_alone(
        recording: tuple[dict[str, Any], bytes, bytes]) -> None:
    check_x25519_alone_opens_nothing(recording[0])


def test_a_fresh_recording_opens_to_its_secrets_with_both_halves(
        recording: tuple[dict[str, Any], bytes, bytes]) -> None:
    recorded, session_key, psk = recording
    assert check_both_halves_open(recorded) == (session_key, psk)


def _version(recording: dict[str, Any], message: str) -> object:
    return decode_canonical(_wire(recording, message), max_size=MAX_RESPONSE_WIRE_BYTES)["v"]


def test_a_client_that_seals_to_host_with_x25519_alone_is_answered_so(database: FakeDatabase,
                                                                      tmp_path: Path) -> None:
    """The browser's page seals with X25519 alone and opens with it alone: Target answers it that
    way (and so never with a post-quantum preshared key), though alice's enrolled keys have ML-KEM."""
    recorded, session_key = record_agent(database, tmp_path, to_host_hybrid=False)
    assert (_version(recorded, "request"), _version(recorded, "endorse"), _version(recorded, "answer")) == (1, 2, 1)
    opened = KeyPair("alice", Ed25519PrivateKey.generate(), _x25519_alone(recorded, "alice")).open_sealed(
        _wire(recorded, "answer"), kinds=[Kind.RESPONSE])
    assert Response.parse(opened[1], kind=Kind.RESPONSE).session_key == session_key


def test_the_stored_recording_gives_nothing_to_the_x25519_keys_alone() -> None:
    check_x25519_alone_opens_nothing(json.loads(RECORDING.read_text()))


def test_the_stored_recording_opens_with_both_halves() -> None:
    stored = json.loads(RECORDING.read_text())
    session_key, psk = check_both_halves_open(stored)
    assert (session_key.hex(), psk.hex()) == (stored["secrets"]["session_key"], stored["secrets"]["peer_psk"])


def _record(path: Path) -> None:  # pragma: no cover - run by hand to make a new recording
    import tempfile

    from app.adapters import files
    from app.services.ratings import load_shipped_tables
    from app.settings import SHIPPED_RATINGS_DIR

    database = FakeDatabase()
    with database.unit() as uow:
        load_shipped_tables(uow=uow, tables=files.load_rating_tables(SHIPPED_RATINGS_DIR))
        uow.commit()
    with tempfile.TemporaryDirectory() as tmp:
        agent, session_key = record_agent(database, Path(tmp))
    peers, psk = record_peers()
    path.write_text(json.dumps({**agent, **peers, "secrets": {"session_key": session_key.hex(),
                                                                 "peer_psk": psk.hex()}}, indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover
    _record(Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDING)
    print(f"recorded {RECORDING}")
