"""What the services count, on the in-memory metrics fake: tunnel set-ups by outcome and their
strongSwan time, VICI calls and failures per gateway, negotiations by outcome, the monitor's lag."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.vici.gateway import ViciGateway
from app.domain.errors import GatewayRejected, NoFeasibleSuite
from app.domain.policies import Levels
from app.domain.requests import NegotiationSpec, PeerSpec
from app.services import tunnels
from app.services.negotiation import run_negotiation
from app.services.tunnel_monitor import TunnelMonitor
from tests.fakes.fake_charon import FakeCharon
from tests.fakes.metrics import RecordingMetrics
from tests.fakes.uow import FakeUnitOfWork
from tests.unit.services.test_tunnels_service import established, fakes, registered, request  # noqa: F401


def test_the_fake_refuses_what_the_catalogue_does_not_declare() -> None:
    metrics = RecordingMetrics()
    with pytest.raises(KeyError):
        metrics.count("qoss_no_such_total")
    with pytest.raises(AssertionError):
        metrics.count("qoss_negotiations_total", result="chosen")
    with pytest.raises(AssertionError):
        metrics.observe("qoss_negotiations_total", 1.0, outcome="chosen")


def test_a_failed_set_up_is_counted_by_its_error_and_the_vici_failure_by_gateway(
        uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]) -> None:  # noqa: F811
    metrics = RecordingMetrics()
    left, _ = fakes
    left.fail("initiate", "establishing CHILD_SA failed", log=["received NO_PROPOSAL_CHOSEN notify"])
    with pytest.raises(GatewayRejected):
        tunnels.create_tunnel(uow=uow, request=request(), default_table="standards-2026",
                              vici=lambda p: ViciGateway(p, timeout=2.0, metrics=metrics), metrics=metrics)
    assert metrics.total("qoss_tunnel_setups_total", outcome="GatewayRejected") == 1
    assert len(metrics.observed[("qoss_tunnel_setup_seconds", (("outcome", "GatewayRejected"),))]) == 1
    assert metrics.total("qoss_vici_errors_total", gateway=str(left.socket_path), error="GatewayRejected") >= 1
    assert metrics.total("qoss_vici_calls_total", gateway=str(left.socket_path)) >= 2


def test_a_set_up_that_comes_up_is_counted_up(
        uow: FakeUnitOfWork, registered: None, fakes: tuple[FakeCharon, FakeCharon]) -> None:  # noqa: F811
    from tests.fakes.fake_charon import Reply

    metrics = RecordingMetrics()
    left, right = fakes

    def up(message: dict[str, object]) -> Reply:
        established(left, str(message["ike"]))
        established(right, str(message["ike"]))
        return Reply({"success": "yes"})

    left.script("initiate", up)  # type: ignore[arg-type]
    tunnels.create_tunnel(uow=uow, request=request(), default_table="standards-2026",
                          vici=lambda p: ViciGateway(p, timeout=2.0), metrics=metrics)
    assert metrics.total("qoss_tunnel_setups_total") == 1
    assert metrics.total("qoss_tunnel_setups_total", outcome="up") == 1


def test_negotiations_are_counted_chosen_or_by_error(uow: FakeUnitOfWork) -> None:
    metrics = RecordingMetrics()
    feasible = NegotiationSpec(peers=(PeerSpec(name="a", min_levels=Levels(integrity=4)),))
    infeasible = NegotiationSpec(peers=(PeerSpec(name="a", min_levels=Levels(integrity=10, confidentiality=10),
                                                 forbids=("sha512",)),))
    run_negotiation(uow=uow, request=feasible, default_table="standards-2026", metrics=metrics)
    with pytest.raises(NoFeasibleSuite):
        run_negotiation(uow=uow, request=infeasible, default_table="standards-2026",
                        metrics=metrics)
    assert metrics.total("qoss_negotiations_total", outcome="chosen") == 1
    assert metrics.total("qoss_negotiations_total", outcome="NoFeasibleSuite") == 1


class _Event:
    kind, ike_name, up = "child-updown", "qoss-abc", False


def test_the_monitor_times_each_check_from_the_first_event_that_asked_for_it(tmp_path: Path) -> None:
    from tests.fakes.uow import FakeDatabase

    metrics = RecordingMetrics()
    db = FakeDatabase()
    monitor = TunnelMonitor(units=db.unit, vici=lambda p: ViciGateway(p), listen=lambda *_: None,  # type: ignore[arg-type,return-value]
                            settle=0.0, resync=3600, metrics=metrics)
    monitor.on_event(_Event())
    monitor.on_event(_Event())  # the same pending check
    monitor.start()
    try:
        for _ in range(2000):
            if metrics.observed:
                break
            import time

            time.sleep(0.005)
    finally:
        monitor.stop()
    lags = metrics.observed[("qoss_monitor_lag_seconds", ())]
    assert len(lags) == 1
    assert lags[0] >= 0


def test_commands_written_at_once_on_a_pipeline_count_as_one_vici_call(tmp_path: Path) -> None:
    """A pipelined batch is one call (as the metric's documentation says), each ``send`` once."""
    from app.domain.charon_port import LoadShared, Unload

    metrics = RecordingMetrics()
    with FakeCharon(tmp_path / "c.vici") as charon:
        gateway = ViciGateway(charon.socket_path, timeout=2.0, metrics=metrics)
        with gateway.pipeline() as pipe:
            pipe.send([LoadShared("x", b"0" * 32, ("a", "b")), Unload("shared", "x")])
            pipe.send([Unload("conn", "x")])
            pipe.finish()
        assert charon.commands[-3:] == ["load-shared", "unload-shared", "unload-conn"]
    assert metrics.total("qoss_vici_calls_total", gateway=str(charon.socket_path)) == 2
