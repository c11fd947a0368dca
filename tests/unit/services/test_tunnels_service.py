"""The tunnel use case against two fake charons speaking VICI (and the in-memory unit of work):
stage, verify, roll back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.sa_events import SaEventHub
from app.domain.errors import (
    GatewayRejected,
    GatewayUnreachable,
    NoFeasibleSuite,
    NotFound,
    TunnelVerificationFailed,
)
from app.domain.policies import Levels
from app.domain.requests import GatewaySpec, TunnelSpec
from app.domain.tunnels import TunnelRecord
from app.services import gateways, tunnels
from app.services.tunnel_setup import teardown
from tests.fakes.fake_charon import FakeCharon, Reply, child_sa_message, ike_sa_message
from tests.fakes.uow import FakeUnitOfWork


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[tuple[FakeCharon, FakeCharon]]:
    with FakeCharon(tmp_path / "left.vici") as left, FakeCharon(tmp_path / "right.vici") as right:
        yield left, right


def vici(path: str) -> ViciGateway:
    return ViciGateway(path, timeout=2.0)


@pytest.fixture
def registered(uow: FakeUnitOfWork, fakes: tuple[FakeCharon, FakeCharon], tmp_path: Path) -> None:
    for fake, name, addr, net in ((fakes[0], "left", "10.99.0.1", "10.1.0.1/32"),
                                  (fakes[1], "right", "10.99.0.2", "10.2.0.1/32")):
        gateways.register_gateway(uow=uow, vici=vici, allowed_socket_dirs=[tmp_path], body=GatewaySpec(
            name=name, vici_socket=fake.socket_path, ike_address=addr, inside_networks=(net,)))
    uow.commit()  # a set-up ends its unit of work's transaction before strongSwan is touched


def request(**kw: object) -> TunnelSpec:
    return TunnelSpec(initiator="left", responder="right",
                      min_levels=Levels(confidentiality=8, integrity=8), **kw)  # type: ignore[arg-type]


def create(uow: FakeUnitOfWork) -> TunnelRecord:
    return tunnels.create_tunnel(uow=uow, vici=vici, request=request(),
                                 default_table="standards-2026")


def established(fake: FakeCharon, name: str, *, encr: str | None = None, integ: str | None = None) -> None:
    """Make the fake report an SA for conn ``name`` as its loaded proposals say (or ``encr`` for ESP)."""
    from app.domain.algorithms import CATALOGUE, Protocol
    from app.domain.proposals import parse

    conn = fake.conns[name]
    ike = parse(conn["proposals"][0], Protocol.IKE)
    esp = parse(conn["children"][name]["esp_proposals"][0], Protocol.ESP)
    ike_encr = CATALOGUE[ike.aead or ike.encryption or ""]
    esp_encr = CATALOGUE[esp.aead or esp.encryption or ""]
    prf = ike.prf or CATALOGUE[ike.integrity or ""].prf
    fake.sas[name] = ike_sa_message(
        uniqueid=1, encr_alg=ike_encr.sa_name, encr_keysize=ike_encr.key_size,
        integ_alg=CATALOGUE[ike.integrity].sa_name if ike.integrity else None,
        prf_alg=CATALOGUE[prf or ""].sa_name, dh_group=CATALOGUE[ike.key_exchange or ""].sa_name,
        children={name: child_sa_message(
            name=name, encr_alg=encr or esp_encr.sa_name, encr_keysize=esp_encr.key_size,
            integ_alg=integ if encr else (CATALOGUE[esp.integrity].sa_name if esp.integrity else None))},
    )


def up_on_initiate(initiator: FakeCharon, *others: FakeCharon) -> None:
    """Make ``initiate`` on ``initiator`` bring the conn up there and on ``others``, as loaded,
    each reporting it (``child-updown``) to its event listeners as charon does."""
    def up(message: dict[str, object]) -> Reply:
        for fake in (initiator, *others):
            name = str(message["ike"])
            established(fake, name)
            fake.emit("child-updown", {"up": "yes", name: fake.sas[name]})
        return Reply({"success": "yes"})

    initiator.script("initiate", up)


def test_registration_reads_backend_and_algorithms(uow: FakeUnitOfWork, registered: None) -> None:
    gw = gateways.get_gateway(uow=uow, name="left")
    assert gw.backend == "kernel-libipsec"
    assert {"aes128", "aes256", "aes128gcm16", "sha256", "modp2048", "x25519"} <= gw.algorithms
    assert "camellia128" not in gw.algorithms


def test_unreachable_gateway_is_not_registered(uow: FakeUnitOfWork, tmp_path: Path) -> None:
    with pytest.raises(GatewayUnreachable, match=str(tmp_path / "none.vici")):
        gateways.register_gateway(uow=uow, vici=vici, allowed_socket_dirs=[tmp_path], body=GatewaySpec(
            name="ghost", vici_socket=str(tmp_path / "none.vici"), ike_address="10.99.0.9",
            inside_networks=("10.9.0.0/24",)))
    assert gateways.list_gateways(uow=uow) == []


def test_negotiation_inputs_keep_the_document_shape_stored_in_provenance() -> None:
    """What a record's provenance holds of its request (read again by re-keys, maybe years on):
    the request document's fields, lists as lists, never the PSK."""
    from app.domain.policies import TrafficProfile
    from app.domain.requests import Secret, TunnelPeerSpec

    full = TunnelSpec(initiator="left", peer=TunnelPeerSpec(address="192.0.2.7", psk=Secret("p" * 40),
                                                            supports=("aes256gcm16", "ecp256")),
                      remote_ts=("10.2.0.0/24",), policy="office", min_levels=Levels(8, 6),
                      objective_id=3, objectives=("O.Comm_Trusted_Channel",), forbids=("3des",),
                      rating_table="standards-2026", traffic=TrafficProfile(512, 100.0), strict=True)
    assert tunnels.negotiation_inputs(full) == {
        "policy": "office", "min_levels": {"confidentiality": 8, "integrity": 6, "key_exchange": 0},
        "objective_id": 3, "objectives": ["O.Comm_Trusted_Channel"], "forbids": ["3des"],
        "rating_table": "standards-2026", "traffic": {"packet_size": 512, "min_throughput_mbps": 100.0},
        "strict": True, "peer_supports": ["aes256gcm16", "ecp256"]}
    assert tunnels.negotiation_inputs(TunnelSpec(initiator="left", responder="right")) == {
        "policy": None, "min_levels": None, "objective_id": None, "objectives": None, "forbids": [],
        "rating_table": None, "traffic": None, "strict": None, "peer_supports": None}


def test_socket_outside_allowed_dirs_is_refused(uow: FakeUnitOfWork, tmp_path: Path) -> None:
    from app.domain.errors import InvalidInput

    with pytest.raises(InvalidInput, match="vici_socket"):
        gateways.register_gateway(uow=uow, vici=vici, allowed_socket_dirs=[tmp_path / "only"],
                                 body=GatewaySpec(name="x", vici_socket="/etc/x.vici", ike_address="10.0.0.1",
                                                        inside_networks=("10.0.0.0/24",)))


def test_infeasible_request_sends_no_load_command(uow: FakeUnitOfWork, registered: None,
                                                  fakes: tuple[FakeCharon, FakeCharon]) -> None:
    with pytest.raises(NoFeasibleSuite):
        tunnels.create_tunnel(uow=uow, vici=vici, default_table="standards-2026",
                              request=TunnelSpec(initiator="left", responder="right",
                                                 min_levels=Levels(integrity=10, confidentiality=10),
                                                 forbids=("sha512",)))
    for fake in fakes:
        assert fake.count("load-conn") == 0
        assert fake.count("load-shared") == 0


def test_initiator_load_failure_unloads_the_responder(uow: FakeUnitOfWork, registered: None,
                                                      fakes: tuple[FakeCharon, FakeCharon]) -> None:
    left, right = fakes
    left.fail("load-conn", "invalid configuration")
    with pytest.raises(GatewayRejected, match="invalid configuration"):
        create(uow)
    assert right.conns == {}
    assert right.shared == {}
    assert left.shared == {}
    assert uow.tunnels.list() == []


def test_initiate_failure_rolls_back_both_ends(uow: FakeUnitOfWork, registered: None,
                                               fakes: tuple[FakeCharon, FakeCharon]) -> None:
    left, _ = fakes
    left.fail("initiate", "establishing CHILD_SA failed", log=["received NO_PROPOSAL_CHOSEN notify"])
    with pytest.raises(GatewayRejected, match="NO_PROPOSAL_CHOSEN"):
        create(uow)
    for fake in fakes:
        assert fake.conns == {}
        assert fake.shared == {}


def test_negotiated_algorithms_differing_from_the_choice_fail_and_roll_back(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]
) -> None:
    left, _ = fakes

    def up_with_wrong_suite(message: dict[str, object]) -> object:
        from tests.fakes.fake_charon import Reply

        name = str(message["ike"])
        for fake in fakes:
            established(fake, name, encr="3DES_CBC", integ="HMAC_SHA1_96")
        return Reply({"success": "yes"})

    left.script("initiate", up_with_wrong_suite)  # type: ignore[arg-type]
    with pytest.raises(TunnelVerificationFailed, match="CHILD_SA encryption: negotiated 3DES_CBC"):
        create(uow)
    for fake in fakes:
        assert fake.conns == {}
        assert fake.shared == {}


def test_success_records_the_tunnel_and_never_logs_the_psk(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], caplog: pytest.LogCaptureFixture
) -> None:
    left, right = fakes

    def up(message: dict[str, object]) -> object:
        from tests.fakes.fake_charon import Reply

        name = str(message["ike"])
        for fake in fakes:
            established(fake, name)
        return Reply({"success": "yes"})

    left.script("initiate", up)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    record = create(uow)
    assert record.negotiation["proposals"]["esp"].startswith("aes128gcm16")
    (shared,) = right.messages("load-shared")
    assert set(shared["owners"]) == {f"{record.id}.left.qoss", f"{record.id}.right.qoss"}
    psk = shared["data"]
    assert len(psk.encode("utf-8", "surrogateescape")) == 32
    assert psk not in caplog.text
    assert psk not in repr(record)
    assert psk not in str(record.as_dict())
    # Responder first: its secret and conn exist before the initiator's.
    order = [(c.command, f) for f in (left, right) for c in f.calls if c.command in ("load-conn", "load-shared")]
    assert len(order) == 4


def test_forget_gateways_drops_their_tunnel_records_and_themselves_only(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], tmp_path: Path
) -> None:
    up_on_initiate(*fakes)
    create(uow)
    with FakeCharon(tmp_path / "other.vici") as other:
        gateways.register_gateway(uow=uow, vici=vici, allowed_socket_dirs=[tmp_path], body=GatewaySpec(
            name="other", vici_socket=other.socket_path, ike_address="10.99.0.3", inside_networks=("10.3.0.1/32",)))
    gateways.forget_gateways(uow=uow, names=["left", "right", "never-registered"])
    assert uow.tunnels.list() == []
    assert [g.name for g in gateways.list_gateways(uow=uow)] == ["other"]
    assert not any(c.command.startswith("unload") for f in fakes for c in f.calls)  # charon is not touched


# -------------------------------------------------------------- charon's reports of SAs coming up


def _create_with(uow: FakeUnitOfWork, reports: SaEventHub) -> TunnelRecord:
    return tunnels.create_tunnel(uow=uow, vici=vici, request=request(),
                                 default_table="standards-2026", reports=reports)


def test_a_set_up_both_charons_report_is_verified_without_list_sas(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub
) -> None:
    left, right = fakes
    up_on_initiate(left, right)
    record = _create_with(uow, hub)
    assert record.state.value == "up"
    assert (hub.reported, hub.missed) == (2, 0)
    for fake in fakes:
        assert "list-sas" not in [c.command for c in fake.calls]


def test_an_end_that_reports_nothing_is_asked_with_list_sas(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub,
    quick_reports: None,
) -> None:
    left, right = fakes

    def up(message: dict[str, object]) -> Reply:
        name = str(message["ike"])
        for fake in fakes:
            established(fake, name)
        left.emit("child-updown", {"up": "yes", name: left.sas[name]})  # the right end stays silent
        return Reply({"success": "yes"})

    left.script("initiate", up)
    assert _create_with(uow, hub).state.value == "up"
    assert (hub.reported, hub.missed) == (1, 1)
    assert "list-sas" not in [c.command for c in left.calls]
    assert [c.message for c in right.calls if c.command == "list-sas"] == [{"ike": f"qoss-{uow.tunnels.list()[0].id}"}]


def test_a_report_that_differs_from_the_choice_is_checked_with_list_sas(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub
) -> None:
    """A report is read only when it shows exactly the chosen suite; otherwise list-sas decides,
    both ways: right there, the tunnel is kept; wrong there too, nothing is."""
    left, _ = fakes

    def reported_wrong(actually_wrong: bool) -> Callable[[dict[str, object]], Reply]:
        def up(message: dict[str, object]) -> Reply:
            name = str(message["ike"])
            for fake in fakes:
                established(fake, name, encr="3DES_CBC", integ="HMAC_SHA1_96")
                fake.emit("child-updown", {"up": "yes", name: fake.sas[name]})
                if not actually_wrong:
                    established(fake, name)
            return Reply({"success": "yes"})
        return up

    left.script("initiate", reported_wrong(actually_wrong=False))
    assert _create_with(uow, hub).state.value == "up"
    assert all("list-sas" in [c.command for c in fake.calls] for fake in fakes)
    uow.commit()
    left.script("initiate", reported_wrong(actually_wrong=True))
    with pytest.raises(TunnelVerificationFailed, match="CHILD_SA encryption: negotiated 3DES_CBC"):
        _create_with(uow, hub)
    assert len(uow.tunnels.list()) == 1
    for fake in fakes:
        assert list(fake.conns) == [f"qoss-{uow.tunnels.list()[0].id}"]


def _timeouts(fake: FakeCharon) -> list[str]:
    return [str(m["timeout"]) for m in fake.messages("initiate")]


def test_between_two_managed_charons_the_initiate_does_not_wait_in_charon(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub
) -> None:
    """No worker thread of charon's is held and no log streamed: the reports tell when it is up."""
    left, right = fakes
    up_on_initiate(left, right)
    assert _create_with(uow, hub).state.value == "up"
    assert _timeouts(left) == ["-1"]
    uow.commit()
    waiting = SaEventHub(detached=False)
    try:
        assert _create_with(uow, waiting).state.value == "up"
    finally:
        waiting.close()
    assert _timeouts(left) == ["-1", "15000"]  # switched off: charon answers once the SAs are up


def test_a_detached_initiate_with_no_report_is_kept_once_list_sas_shows_it_up(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub,
    quick_reports: None,
) -> None:
    left, _ = fakes

    def up_in_silence(message: dict[str, object]) -> Reply:
        for fake in fakes:
            established(fake, str(message["ike"]))  # and no report from either end
        return Reply({"success": "yes"})

    left.script("initiate", up_in_silence)
    assert _create_with(uow, hub).state.value == "up"
    assert _timeouts(left) == ["-1"]  # not initiated twice
    assert all("list-sas" in [c.command for c in fake.calls] for fake in fakes)


@pytest.mark.parametrize("left_behind", ["nothing", "an IKE_SA without its CHILD_SA"])
def test_a_detached_initiate_that_failed_is_asked_again_waiting_and_charons_reason_is_the_error(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub,
    quick_reports: None, left_behind: str,
) -> None:
    left, _ = fakes

    def refused(message: dict[str, object]) -> Reply:
        name = str(message["ike"])
        if message["timeout"] == "-1":  # queued; what charon then does leaves no SA up
            if left_behind != "nothing":
                left.sas[name] = ike_sa_message(children={})
            return Reply({"success": "yes"})
        return Reply({"success": "no", "errmsg": "establishing CHILD_SA failed"},
                     [("control-log", {"group": "IKE", "level": "1", "msg": "received NO_PROPOSAL_CHOSEN notify"})])

    left.script("initiate", refused)
    with pytest.raises(GatewayRejected, match="NO_PROPOSAL_CHOSEN"):
        _create_with(uow, hub)
    assert _timeouts(left)[0] == "-1"
    assert int(_timeouts(left)[1]) > 0
    assert uow.tunnels.list() == []
    for fake in fakes:
        assert fake.conns == {}
        assert fake.shared == {}


def test_a_detached_initiate_still_connecting_at_the_timeout_is_refused_and_leaves_nothing(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon], hub: SaEventHub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.services import tunnel_setup

    monkeypatch.setattr(tunnel_setup, "REPORT_WAIT", 0.05)
    monkeypatch.setattr(tunnel_setup, "INITIATE_TIMEOUT_MS", 400)
    left, _ = fakes

    def connecting(message: dict[str, object]) -> Reply:
        left.sas[str(message["ike"])] = ike_sa_message(state="CONNECTING", children={})
        return Reply({"success": "yes"})

    left.script("initiate", connecting)
    with pytest.raises(GatewayRejected, match="was not up within"):
        _create_with(uow, hub)
    assert _timeouts(left) == ["-1"]
    assert uow.tunnels.list() == []
    for fake in fakes:
        assert fake.conns == {}


# -- teardown ---------------------------------------------------------------------------------


def _up(uow: FakeUnitOfWork, fakes: tuple[FakeCharon, FakeCharon]) -> TunnelRecord:
    up_on_initiate(*fakes)
    record = create(uow)
    uow.commit()
    return record


def _tail(fake: FakeCharon, n: int) -> list[str]:
    return [c.command for c in fake.calls][-n:]


def test_a_delete_asks_both_ends_side_by_side_and_leaves_nothing_loaded(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]
) -> None:
    """The initiator's terminate cannot end before the responder got its own: had the ends been
    asked one after the other, the responder's would only come after the wait."""
    left, right = fakes
    record = _up(uow, fakes)
    right_asked = threading.Event()
    seen: list[bool] = []

    def left_terminate(message: dict[str, object]) -> Reply:
        seen.append(right_asked.wait(1.5))
        left.sas.pop(str(message["ike"]), None)
        return Reply({"success": "yes", "matches": "1", "terminated": "1"})

    def right_terminate(message: dict[str, object]) -> Reply:
        right_asked.set()
        right.sas.pop(str(message["ike"]), None)
        return Reply({"success": "yes", "matches": "1", "terminated": "1"})

    left.script("terminate", left_terminate)
    right.script("terminate", right_terminate)
    tunnels.delete_tunnel(uow=uow, vici=vici, tunnel_id=record.id)
    assert seen == [True]
    for fake in fakes:
        assert _tail(fake, 3) == ["terminate", "unload-conn", "unload-shared"]
        assert (fake.conns, fake.shared, fake.sas) == ({}, {}, {})
    with pytest.raises(NotFound):
        uow.tunnels.get(record.id)


def test_a_delete_of_a_tunnel_already_down_is_no_error(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]
) -> None:
    record = _up(uow, fakes)
    for fake in fakes:
        fake.sas.clear()  # terminate answers "no matching SAs"
    tunnels.delete_tunnel(uow=uow, vici=vici, tunnel_id=record.id)
    for fake in fakes:
        assert (fake.conns, fake.shared) == ({}, {})


def test_an_unload_one_end_refuses_fails_a_delete_the_other_end_is_still_cleared(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]
) -> None:
    left, right = fakes
    record = _up(uow, fakes)
    right.fail("unload-shared", "unloading shared secret failed")
    with pytest.raises(GatewayRejected, match="unloading shared secret failed"):
        tunnels.delete_tunnel(uow=uow, vici=vici, tunnel_id=record.id)
    uow.rollback()
    assert uow.tunnels.get(record.id).id == record.id  # kept: the delete can be sent again
    assert (left.conns, left.shared, left.sas) == ({}, {}, {})
    assert (right.conns, right.sas) == ({}, {})  # the commands after the refused one ran too
    # The same refusal where nothing is strict (reconcile, a failed set-up's undo): no error.
    teardown(record, uow.gateways.get("left"), uow.gateways.get("right"), vici, strict=False)


def test_a_delete_with_one_charon_unreachable_is_503_and_the_other_end_is_cleared(
    uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]
) -> None:
    left, right = fakes
    record = _up(uow, fakes)
    right.stop()
    with pytest.raises(GatewayUnreachable):
        tunnels.delete_tunnel(uow=uow, vici=vici, tunnel_id=record.id)
    assert (left.conns, left.shared, left.sas) == ({}, {}, {})
