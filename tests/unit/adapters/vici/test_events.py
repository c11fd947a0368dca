"""EventListener against the fake charon: registration, typed events, clean stop, errors."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

from app.adapters.vici import EventKind, EventListener, SaEvent
from app.adapters.vici.events import parse_event
from app.domain.errors import GatewayError, GatewayUnreachable
from tests.fakes import FakeCharon, child_sa_message, ike_sa_message


def _wait(predicate: object, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_listener_registers_delivers_and_unregisters(fake: FakeCharon) -> None:
    got: queue.Queue[SaEvent] = queue.Queue()
    with EventListener(fake.socket_path, got.put, poll_interval=0.05) as listener:
        assert listener.running
        for kind in EventKind:
            assert fake.listeners(kind.value) == 1
        child = child_sa_message(name="t", uniqueid=4, encr_alg="AES_GCM_16", integ_alg=None)
        fake.emit("ike-updown", {"up": "yes", "t": ike_sa_message(uniqueid=9)})
        fake.emit("child-updown", {"t": ike_sa_message(uniqueid=9, children={"t-4": child})})
        first, second = got.get(timeout=2), got.get(timeout=2)
    assert not listener.running
    assert fake.listeners("ike-updown") == 0
    assert (first.kind, first.ike_name, first.up) == (EventKind.IKE_UPDOWN, "t", True)
    assert first.ike_sa is not None
    assert first.ike_sa.uniqueid == 9
    assert (second.kind, second.up) == (EventKind.CHILD_UPDOWN, False)
    assert [(c.name, c.uniqueid, c.encr_alg) for c in second.children] == [("t", 4, "AES_GCM_16")]


def test_rekey_events_carry_old_and_new(fake: FakeCharon) -> None:
    got: queue.Queue[SaEvent] = queue.Queue()
    with EventListener(fake.socket_path, got.put, poll_interval=0.05):
        fake.emit("ike-rekey", {"t": {"old": ike_sa_message(uniqueid=1), "new": ike_sa_message(uniqueid=2)}})
        body = ike_sa_message(uniqueid=2)
        body["child-sas"] = {"t": {"old": child_sa_message(uniqueid=5), "new": child_sa_message(uniqueid=6)}}
        fake.emit("child-rekey", {"t": body})
        ike, child = got.get(timeout=2), got.get(timeout=2)
    assert ike.kind is EventKind.IKE_REKEY
    assert ike.up is None
    assert ike.old_ike_sa is not None
    assert ike.old_ike_sa.uniqueid == 1
    assert ike.ike_sa is not None
    assert ike.ike_sa.uniqueid == 2
    assert child.kind is EventKind.CHILD_REKEY
    assert [c.uniqueid for c in child.old_children] == [5]
    assert [c.uniqueid for c in child.children] == [6]


def test_callback_errors_do_not_stop_the_listener(fake: FakeCharon) -> None:
    seen: list[int] = []

    def callback(event: SaEvent) -> None:
        assert event.ike_sa is not None
        seen.append(event.ike_sa.uniqueid)
        if len(seen) == 1:
            raise RuntimeError("boom")

    with EventListener(fake.socket_path, callback, poll_interval=0.05):
        fake.emit("ike-updown", {"a": ike_sa_message(uniqueid=1)})
        fake.emit("ike-updown", {"a": ike_sa_message(uniqueid=2)})
        _wait(lambda: len(seen) == 2)
    assert seen == [1, 2]


def test_start_on_missing_socket_raises_unreachable(socket_dir: Path) -> None:
    path = str(socket_dir / "none.vici")
    listener = EventListener(path, lambda e: None)
    with pytest.raises(GatewayUnreachable) as info:
        listener.start()
    assert info.value.socket_path == path
    assert not listener.running


def test_lost_connection_is_reported(fake: FakeCharon) -> None:
    errors: list[GatewayError] = []
    listener = EventListener(fake.socket_path, lambda e: None, on_error=errors.append, poll_interval=0.05)
    listener.start()
    try:
        fake.stop()
        _wait(lambda: bool(errors))
    finally:
        listener.stop()
    assert isinstance(errors[0], GatewayUnreachable)
    assert listener.error is errors[0]


def test_stop_is_prompt(fake: FakeCharon) -> None:
    listener = EventListener(fake.socket_path, lambda e: None, poll_interval=0.05)
    listener.start()
    started = time.monotonic()
    listener.stop()
    assert time.monotonic() - started < 1.0
    assert not listener.running


def test_parse_event_ignores_unknown_names() -> None:
    assert parse_event("log", {"msg": "hello"}) == []
