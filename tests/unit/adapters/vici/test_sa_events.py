"""The process's one event connection per charon: set-ups' waits and the monitor's subscription."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.vici.events import EventListener, SaEvent
from app.adapters.vici.sa_events import RETRY_AFTER, SaEventHub
from app.domain.errors import GatewayUnreachable
from tests.fakes import FakeCharon
from tests.fakes.fake_charon import child_sa_message, ike_sa_message
from tests.fixtures.waiting import until

WAIT = 10.0  # returns as soon as the event is there; this long only if the test is failing


def _up(name: str, *, child: str | None = None) -> dict[str, object]:
    child = child or name
    return {"up": "yes", name: ike_sa_message(children={f"{child}-7": child_sa_message(name=child)})}


def test_a_wait_gets_the_report_of_its_own_conn(fake: FakeCharon, hub: SaEventHub) -> None:
    with hub.expect(fake.socket_path, "qoss-a") as wait_a, hub.expect(fake.socket_path, "qoss-b") as wait_b:
        assert fake.listeners("child-updown") == 1
        fake.emit("child-updown", _up("qoss-b"))
        fake.emit("child-updown", _up("qoss-a"))
        a, b = wait_a(WAIT), wait_b(WAIT)
    assert a is not None
    assert b is not None
    assert (a.name, [c.name for c in a.children], b.name) == ("qoss-a", ["qoss-a"], "qoss-b")
    assert (a.state, a.children[0].state) == ("ESTABLISHED", "INSTALLED")
    assert (hub.reported, hub.missed) == (2, 0)


def test_only_a_child_sa_coming_up_is_a_report(fake: FakeCharon, hub: SaEventHub) -> None:
    with hub.expect(fake.socket_path, "qoss-a") as wait:
        fake.emit("ike-updown", _up("qoss-a"))  # the IKE_SA alone
        fake.emit("child-updown", {**_up("qoss-a"), "up": "no"})  # down
        fake.emit("child-updown", _up("qoss-a", child="other"))  # another CHILD_SA of that IKE_SA
        assert wait(0.3) is None
    assert (hub.reported, hub.missed) == (0, 1)


def test_a_wait_ended_leaves_nothing_registered(fake: FakeCharon, hub: SaEventHub) -> None:
    seen: list[SaEvent] = []
    hub.listener(fake.socket_path, seen.append).start()
    with hub.expect(fake.socket_path, "qoss-a") as wait:
        assert wait(0.05) is None
    fake.emit("child-updown", _up("qoss-a"))  # nobody waits for it any more
    assert until(lambda: len(seen) == 1), "the event was delivered"
    with hub.expect(fake.socket_path, "qoss-a") as wait:
        assert wait(0.05) is None  # the old report is not kept for a later set-up of that name
    assert hub._sockets[fake.socket_path].waiters == {}


def test_without_an_event_connection_a_wait_answers_none_at_once_and_the_hub_tries_again_later(
    socket_dir: Path,
) -> None:
    now = [0.0]
    starts: list[str] = []

    def listen(path: str, callback: object) -> EventListener:
        starts.append(path)
        return EventListener(path, callback, timeout=1.0)  # type: ignore[arg-type]

    hub = SaEventHub(listen=listen, clock=lambda: now[0])
    path = str(socket_dir / "absent.vici")
    try:
        with hub.expect(path, "qoss-a") as wait:
            assert wait(3600) is None  # no listener: no waiting at all
        with hub.expect(path, "qoss-a") as wait:
            assert wait(3600) is None
        assert len(starts) == 1  # not tried again within RETRY_AFTER
        now[0] += RETRY_AFTER
        with FakeCharon(path) as fake, hub.expect(path, "qoss-a") as wait:
            fake.emit("child-updown", _up("qoss-a"))
            assert wait(WAIT) is not None
        assert len(starts) == 2
        assert (hub.reported, hub.missed) == (1, 2)
    finally:
        hub.close()


def test_the_monitors_subscription_shares_the_connection_and_comes_back_after_a_charon_restart(
    socket_dir: Path, hub: SaEventHub
) -> None:
    path = str(socket_dir / "charon.vici")
    seen: list[SaEvent] = []
    with FakeCharon(path) as fake:
        subscription = hub.listener(path, seen.append)
        subscription.start()
        assert subscription.running
        with hub.expect(path, "qoss-a") as wait:
            assert fake.listeners("child-updown") == 1  # one connection for both
            fake.emit("child-updown", _up("qoss-a"))
            assert wait(WAIT) is not None
        assert until(lambda: len(seen) == 1), "the subscriber got the event"
    assert until(lambda: not subscription.running), "the subscription is seen to have lost its charon"
    with FakeCharon(path) as fake:
        again = hub.listener(path, seen.append)  # what the monitor does on its next resync
        again.start()
        assert again.running
        fake.emit("child-updown", _up("qoss-b"))
        assert until(lambda: len(seen) == 2), "the event after the restart"
        fake.emit("ike-updown", _up("qoss-c"))
        assert until(lambda: len(seen) == 3), "one more"
        assert [e.ike_name for e in seen] == ["qoss-a", "qoss-b", "qoss-c"]  # each once
        again.stop()
        fake.emit("child-updown", _up("qoss-d"))
        with hub.expect(path, "qoss-e") as wait:  # the connection goes on for set-ups
            fake.emit("child-updown", _up("qoss-e"))
            assert wait(WAIT) is not None
        assert [e.ike_name for e in seen] == ["qoss-a", "qoss-b", "qoss-c"]
        hub.close()
        assert until(lambda: fake.listeners("child-updown") == 0), "close ends the connection"


def test_a_subscription_to_an_unreachable_charon_raises(socket_dir: Path, hub: SaEventHub) -> None:
    subscription = hub.listener(str(socket_dir / "absent.vici"), lambda _: None)
    with pytest.raises(GatewayUnreachable):
        subscription.start()
    assert not subscription.running
