"""The tunnel monitor tries a gateway whose charon does not answer less and less often (at most
every ``retry_max`` seconds), and as often as ever once it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.adapters.vici.events import SaEvent
from app.domain.errors import GatewayUnreachable
from app.domain.tunnels import Gateway
from app.services.tunnel_monitor import TunnelMonitor
from tests.fakes.uow import FakeDatabase

SOCKET = "/run/qoss/garbage.vici"


@dataclass
class Charon:
    """Whether the charon on :data:`SOCKET` answers, and at which looks it was tried."""

    answers: bool = False
    look: int = 0
    tried: list[int] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)


@dataclass
class Listener:
    charon: Charon
    running: bool = False

    def start(self) -> None:
        self.charon.tried.append(self.charon.look)
        if not self.charon.answers:
            raise GatewayUnreachable(SOCKET, "VICI protocol error in version: garbage")
        self.running = True

    def stop(self, timeout: float = 5.0) -> None:
        self.running = False


def _monitor(database: FakeDatabase, charon: Charon, *, resync: float, retry_max: float) -> TunnelMonitor:
    with database.unit() as uow:
        uow.gateways.create(Gateway(name="gw", vici_socket=SOCKET, ike_address="10.99.0.1", identity="gw.qoss",
                                    inside_networks=("10.1.0.1/32",)))
        uow.commit()

    def listen(path: str, callback: Callable[[SaEvent], None]) -> Listener:
        charon.listeners.append(Listener(charon))
        return charon.listeners[-1]

    return TunnelMonitor(units=database.unit, vici=lambda path: None,  # type: ignore[arg-type,return-value]
                         listen=listen, resync=resync, retry_max=retry_max)


def _looks(monitor: TunnelMonitor, charon: Charon, count: int) -> None:
    for _ in range(count):
        monitor.sync_listeners()
        charon.look += 1


def test_a_charon_that_does_not_answer_is_tried_after_doubling_waits(database: FakeDatabase) -> None:
    charon = Charon()
    monitor = _monitor(database, charon, resync=5.0, retry_max=300.0)
    _looks(monitor, charon, 200)
    assert charon.tried[:7] == [0, 1, 3, 7, 15, 31, 63]  # 5 s, 10 s, 20 s ... between tries
    assert [b - a for a, b in zip(charon.tried[6:], charon.tried[7:], strict=False)] == [60, 60]  # then 5 min
    monitor.stop()


def test_a_charon_that_answers_again_is_watched_and_tried_at_once_when_lost_again(database: FakeDatabase) -> None:
    charon = Charon()
    monitor = _monitor(database, charon, resync=1.0, retry_max=8.0)
    _looks(monitor, charon, 30)
    assert charon.tried == [0, 1, 3, 7, 15, 23]  # waits of 1, 2, 4, 8, 8 looks
    charon.answers = True
    _looks(monitor, charon, 9)
    assert charon.tried[-1] == 31
    assert monitor.watched == [SOCKET]
    listener_lost_at = charon.look
    charon.listeners[-1].running = False  # charon restarted
    charon.answers = False
    _looks(monitor, charon, 3)
    assert charon.tried[-2:] == [listener_lost_at, listener_lost_at + 1]  # its backoff starts over
    monitor.stop()
