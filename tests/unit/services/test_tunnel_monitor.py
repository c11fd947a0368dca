"""The tunnel monitor on a migrated database (SQLite and PostgreSQL) with charons we script.

The event source and ``list-sas`` are seams the monitor is given; what is real is the
database and the monitor's own thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from app.adapters.vici.events import EventKind, SaEvent
from app.adapters.vici.models import IkeSa, parse_ike_sa
from app.domain.errors import GatewayUnreachable
from app.domain.tunnels import Gateway, TunnelRecord, TunnelState
from app.services import tunnel_monitor
from app.services.tunnel_monitor import TunnelMonitor
from tests.fakes.uow import FakeDatabase
from tests.fixtures.waiting import until


@dataclass
class Charon:
    """What one scripted charon says: the SAs per conn name, or that it is unreachable."""

    socket: str
    established: set[str] = field(default_factory=set)
    down: bool = False
    asked: int = 0

    def list_sas(self, *, ike: str | None = None) -> list[IkeSa]:
        self.asked += 1
        if self.down:
            raise GatewayUnreachable(self.socket, "no such socket")
        names = sorted(self.established) if ike is None else [ike] if ike in self.established else []
        return [parse_ike_sa(name, {"state": "ESTABLISHED", "local-host": "10.99.0.1", "remote-host": "10.99.0.2",
                                    "child-sas": {f"{name}-1": {"name": name, "state": "INSTALLED",
                                                                "protocol": "ESP", "mode": "TUNNEL"}}})
                for name in names]


@dataclass
class FakeListener:
    socket: str
    callback: Callable[[SaEvent], None]
    alive: bool = False
    refuse: bool = False

    @property
    def running(self) -> bool:
        return self.alive

    def start(self) -> None:
        if self.refuse:
            raise GatewayUnreachable(self.socket, "no such socket")
        self.alive = True

    def stop(self, timeout: float = 5.0) -> None:
        self.alive = False


@pytest.fixture
def world(database: FakeDatabase) -> tuple[dict[str, Charon], list[FakeListener]]:
    charons = {"/run/left.vici": Charon("/run/left.vici"), "/run/right.vici": Charon("/run/right.vici")}
    with database.unit() as uow:
        gateways = uow.gateways
        for name, path, addr in (("left", "/run/left.vici", "10.99.0.1"), ("right", "/run/right.vici", "10.99.0.2")):
            gateways.create(Gateway(name=name, vici_socket=path, ike_address=addr, identity=f"{name}.qoss",
                                    inside_networks=("10.1.0.1/32",), backend="kernel-libipsec"))
        tunnels = uow.tunnels
        for tid, state in (("aaa", TunnelState.UP), ("bbb", TunnelState.FAILED)):
            tunnels.add(TunnelRecord(id=tid, initiator="left", responder="right", local_ts=("10.1.0.1/32",),
                                     remote_ts=("10.2.0.1/32",), state=state, negotiation={}))
        uow.commit()
    for c in charons.values():
        c.established.add("qoss-aaa")
    return charons, []


def _monitor(database: FakeDatabase, charons: dict[str, Charon],
             listeners: list[FakeListener]) -> TunnelMonitor:
    def listen(path: str, callback: Callable[[SaEvent], None]) -> FakeListener:
        listener = FakeListener(path, callback)
        listeners.append(listener)
        return listener

    return TunnelMonitor(units=database.unit, vici=lambda path: charons[path],
                         listen=listen, settle=0.05, resync=0.2)


def _event(name: str, up: bool, kind: EventKind = EventKind.CHILD_UPDOWN) -> SaEvent:
    return SaEvent(kind=kind, ike_name=name, up=up, ike_sa=None)


def _state(database: FakeDatabase, tid: str) -> tuple[TunnelState, str]:
    with database.unit() as uow:
        record = uow.tunnels.get(tid)
        return record.state, record.detail


def test_sa_going_down_marks_the_tunnel_down_and_coming_back_up(database: FakeDatabase,
                                                                world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    monitor = _monitor(database, charons, listeners)
    monitor.start()
    try:
        assert until(lambda: monitor.watched == ["/run/left.vici", "/run/right.vici"])
        charons["/run/right.vici"].established.clear()  # the peer end went away
        listeners[0].callback(_event("qoss-aaa", up=False))
        assert until(lambda: _state(database, "aaa")[0] is TunnelState.DOWN)
        assert _state(database, "aaa")[1] == "SA went down (charon event)"
        charons["/run/right.vici"].established.add("qoss-aaa")
        listeners[1].callback(_event("qoss-aaa", up=True, kind=EventKind.IKE_UPDOWN))
        assert until(lambda: _state(database, "aaa")[0] is TunnelState.UP)
        assert until(lambda: monitor.changes == 2)  # counted just after the record is written
    finally:
        monitor.stop()
    assert not any(listener.running for listener in listeners)


def test_events_that_change_nothing_leave_records_alone(database: FakeDatabase,
                                                        world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    monitor = _monitor(database, charons, listeners)
    # Not ours, a record that does not exist, a failed tunnel, an up event while up, a rekey.
    for event in (_event("roadwarrior", up=False), _event("qoss-zzz", up=False), _event("qoss-bbb", up=False),
                  _event("qoss-aaa", up=True), SaEvent(kind=EventKind.CHILD_REKEY, ike_name="qoss-aaa", up=None,
                                                       ike_sa=None)):
        monitor.on_event(event)
    for tid in ("zzz", "bbb", "aaa"):
        monitor.check(tid)
    assert _state(database, "aaa")[0] is TunnelState.UP
    assert _state(database, "bbb")[0] is TunnelState.FAILED
    assert monitor.changes == 0
    assert charons["/run/left.vici"].asked == 1  # only the up tunnel was looked at


def test_unreachable_charon_changes_nothing(database: FakeDatabase,
                                            world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    monitor = _monitor(database, charons, listeners)
    charons["/run/left.vici"].down = True
    monitor.check("aaa")
    assert _state(database, "aaa")[0] is TunnelState.UP


def test_lost_listeners_are_reconnected_and_their_tunnels_rechecked(database: FakeDatabase,
                                                                     world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    monitor = _monitor(database, charons, listeners)
    monitor.sync_listeners()
    assert monitor.watched == ["/run/left.vici", "/run/right.vici"]
    listeners[0].alive = False  # charon restarted: the connection is gone, and so is the SA
    charons["/run/left.vici"].established.clear()
    monitor.sync_listeners()
    assert len(listeners) == 3
    assert monitor.watched == ["/run/left.vici", "/run/right.vici"]
    assert _state(database, "aaa")[0] is TunnelState.DOWN  # events missed meanwhile: checked anyway
    monitor.stop()


def test_a_reconnected_listener_checks_all_its_tunnels_with_one_list_sas_per_charon(
        database: FakeDatabase, world: tuple[dict[str, Charon], list], monkeypatch: pytest.MonkeyPatch) -> None:
    charons, listeners = world
    monkeypatch.setattr(tunnel_monitor, "_CHECK_PAGE", 7)  # the records are read in pages: 32 span five
    with database.unit() as uow:
        for n in range(30):
            uow.tunnels.add(TunnelRecord(id=f"t{n:02}", initiator="left", responder="right",
                                         local_ts=(f"10.1.1.{n}/32",), remote_ts=("10.2.0.1/32",),
                                         state=TunnelState.DOWN if n % 10 == 0 else TunnelState.UP, negotiation={}))
        uow.commit()
    for charon in charons.values():
        charon.established |= {f"qoss-t{n:02}" for n in range(30) if n % 3}  # every third one is down
    monitor = _monitor(database, charons, listeners)
    monitor.sync_listeners()  # both listeners new: every tunnel checked, one list-sas of each charon each time
    assert {path: c.asked for path, c in charons.items()} == {"/run/left.vici": 2, "/run/right.vici": 2}
    states = {n: _state(database, f"t{n:02}")[0] for n in range(30)}
    assert states == {n: TunnelState.UP if n % 3 else TunnelState.DOWN for n in range(30)}
    assert monitor.changes == sum(1 for n in range(30) if (n % 3 == 0) != (n % 10 == 0))
    assert _state(database, "aaa")[0] is TunnelState.UP
    assert _state(database, "bbb")[0] is TunnelState.FAILED  # not the monitor's to move
    listeners[0].alive = False
    charons["/run/right.vici"].down = True  # the far end does not answer: nothing is said of its tunnels
    charons["/run/left.vici"].established.clear()
    monitor.sync_listeners()
    assert _state(database, "t01")[0] is TunnelState.UP
    monitor.stop()


def test_a_charon_that_is_not_there_yet_is_tried_again(database: FakeDatabase,
                                                       world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    refused: list[str] = []

    def listen(path: str, callback: Callable[[SaEvent], None]) -> FakeListener:
        listener = FakeListener(path, callback, refuse=path not in refused)
        refused.append(path)
        listeners.append(listener)
        return listener

    monitor = TunnelMonitor(units=database.unit, vici=lambda path: charons[path],
                            listen=listen, settle=0.05, resync=0.2)
    monitor.sync_listeners()
    assert monitor.watched == []
    monitor.sync_listeners()
    assert monitor.watched == ["/run/left.vici", "/run/right.vici"]
    monitor.stop()


def test_a_change_made_while_charon_is_asked_wins_over_the_check(database: FakeDatabase,
                                                                 world: tuple[dict[str, Charon], list]) -> None:
    """The check asks charon outside any write transaction; a move or a delete that commits
    meanwhile is not overwritten by what the check saw before it."""
    charons, listeners = world
    right = charons["/run/right.vici"]
    right.established.clear()  # the check will see the SA gone ...

    class Racing(Charon):
        def list_sas(self, *, ike: str | None = None) -> list[IkeSa]:
            with database.unit() as uow:  # ... while a move marks the tunnel configuring
                uow.tunnels.set_state("aaa", TunnelState.CONFIGURING, "moving")
                uow.commit()
            return right.list_sas(ike=ike)

    charons["/run/right.vici"] = Racing(right.socket)
    monitor = _monitor(database, charons, listeners)
    monitor.check("aaa")
    assert _state(database, "aaa") == (TunnelState.CONFIGURING, "moving")
    assert monitor.changes == 0


def test_a_burst_of_set_ups_costs_charon_nothing_and_a_down_among_them_is_still_seen(
        database: FakeDatabase, world: tuple[dict[str, Charon], list]) -> None:
    charons, listeners = world
    with database.unit() as uow:
        for i in range(50):
            uow.tunnels.add(TunnelRecord(id=f"n{i:02}", initiator="left", responder="right",
                                         local_ts=("10.1.0.1/32",), remote_ts=("10.2.0.1/32",),
                                         state=TunnelState.UP, negotiation={}))
        uow.commit()
    for c in charons.values():
        c.established |= {f"qoss-n{i:02}" for i in range(50)}
    monitor = _monitor(database, charons, listeners)
    monitor.start()
    try:
        assert until(lambda: monitor.watched == ["/run/left.vici", "/run/right.vici"])
        # Each listener's connect checks every tunnel on its gateway once: one list-sas of each end.
        assert until(lambda: all(c.asked == 2 for c in charons.values()))
        for c in charons.values():
            c.asked = 0
        for i in range(50):
            for listener in listeners:
                listener.callback(_event(f"qoss-n{i:02}", up=True, kind=EventKind.IKE_UPDOWN))
                listener.callback(_event(f"qoss-n{i:02}", up=True))
        charons["/run/right.vici"].established.clear()
        listeners[0].callback(_event("qoss-aaa", up=False))  # in the same batch
        assert until(lambda: _state(database, "aaa")[0] is TunnelState.DOWN)
        assert [c.asked for c in charons.values()] == [1, 1]  # only "aaa", on each end
        assert all(_state(database, f"n{i:02}")[0] is TunnelState.UP for i in range(50))
    finally:
        monitor.stop()


def test_down_events_of_deleted_tunnels_ask_charon_nothing_and_leave_nothing_pending(
        database: FakeDatabase, world: tuple[dict[str, Charon], list]) -> None:
    """A delete terminates the SAs (ike-updown and child-updown down, on both ends) and then
    removes the record: the monitor's checks of those events find no record, ask no charon and
    keep nothing once done."""
    charons, listeners = world
    monitor = _monitor(database, charons, listeners)
    monitor.start()
    try:
        assert until(lambda: monitor.watched == ["/run/left.vici", "/run/right.vici"])
        assert until(lambda: all(c.asked == 2 for c in charons.values()))  # "aaa", at each connect
        for c in charons.values():
            c.asked = 0
        for i in range(500):
            for listener in listeners:
                listener.callback(_event(f"qoss-gone{i:03}", up=False))
                listener.callback(_event(f"qoss-gone{i:03}", up=False, kind=EventKind.IKE_UPDOWN))
        assert until(lambda: monitor.pending == 0)
        assert [c.asked for c in charons.values()] == [0, 0]
        assert monitor.changes == 0
        assert _state(database, "aaa")[0] is TunnelState.UP
    finally:
        monitor.stop()


def test_a_burst_of_events_wakes_the_loop_once_and_every_tunnel_is_checked(
        database: FakeDatabase, world: tuple[dict[str, Charon], list]) -> None:
    """The first event wakes a loop that waits for nothing sooner; the burst's later events are
    due no earlier than the first, so they wait for the loop's own wake-up at each tick."""
    charons, listeners = world
    with database.unit() as uow:
        for n in range(20):
            uow.tunnels.add(TunnelRecord(id=f"b{n:02}", initiator="left", responder="right",
                                         local_ts=(f"10.1.2.{n}/32",), remote_ts=("10.2.0.1/32",),
                                         state=TunnelState.DOWN, negotiation={}))
        uow.commit()
    for charon in charons.values():
        charon.established |= {f"qoss-b{n:02}" for n in range(20)}

    def listen(path: str, callback: Callable[[SaEvent], None]) -> FakeListener:
        listeners.append(FakeListener(path, callback))
        return listeners[-1]

    monitor = TunnelMonitor(units=database.unit, vici=lambda path: charons[path], listen=listen,
                            settle=0.2, tick=0.1, resync=60)
    monitor.start()
    try:
        assert until(lambda: monitor.watched == ["/run/left.vici", "/run/right.vici"])
        assert until(lambda: monitor.pending == 0)
        wakes: list[float] = []
        notify = monitor._wake.notify_all

        def counted() -> None:
            wakes.append(1.0)
            notify()

        monitor._wake.notify_all = counted  # type: ignore[method-assign]
        for n in range(20):
            listeners[n % 2].callback(_event(f"qoss-b{n:02}", up=True))
        assert until(lambda: all(_state(database, f"b{n:02}")[0] is TunnelState.UP for n in range(20)))
        assert len(wakes) == 1
    finally:
        monitor.stop()
