"""One listener per charon per process for its up/down events, shared by whoever needs them.

A tunnel set-up that has just initiated a conn needs to know what charon installed; the
tunnel monitor needs to know when an SA comes up or goes down. Both are told by charon
itself: ``child-updown`` carries the IKE_SA and the CHILD_SA with their algorithms and
states, exactly what ``list-sas`` would answer for that conn a moment later. Asking
``list-sas`` instead costs charon a walk over every IKE_SA it holds (it has no lookup by
name), so it grows with the tunnels up; reading the event costs nothing more than the
listener the monitor keeps anyway.

:class:`SaEventHub` keeps one :class:`~app.adapters.vici.events.EventListener` per VICI
socket (``ike-updown`` and ``child-updown``), started the first time someone needs it and
started again when it has died (charon restarted). Two kinds of users:

* :meth:`SaEventHub.expect`: a set-up registers the conn it is about to initiate, then waits
  (briefly) for the ``child-updown`` that reports it up. No event in time, or no listener
  (charon unreachable on its event connection): the wait answers None and the caller asks
  ``list-sas`` as before. An event is a report, never a verdict against the caller's check:
  a caller that finds it wrong asks ``list-sas`` too.
* :meth:`SaEventHub.listener`: a subscription with the tunnel monitor's listener interface
  (``start``, ``stop``, ``running``), so the monitor's events come through the same
  connection.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.adapters.vici.events import EventKind, EventListener, SaEvent, updown_listener
from app.adapters.vici.models import IkeSa
from app.domain.errors import GatewayError
from app.domain.ports import NO_METRICS, Metrics

__all__ = ["SaEventHub", "Subscription"]

_log = logging.getLogger(__name__)

#: Seconds between tries to (re)start a socket's listener after it could not be started:
#: a set-up on a charon without an event connection asks ``list-sas`` meanwhile.
RETRY_AFTER = 5.0


@dataclass
class _Waiter:
    """One set-up's wait for the CHILD_SA of conn ``name`` to be reported up."""

    name: str
    arrived: threading.Event = field(default_factory=threading.Event)
    sa: IkeSa | None = None


class _Socket:
    """The listener of one socket, its subscribers and its waiters."""

    def __init__(self) -> None:
        self.listener: EventListener | None = None
        self.failed_at: float | None = None
        self.subscribers: list[Callable[[SaEvent], None]] = []
        self.waiters: dict[str, list[_Waiter]] = {}


class SaEventHub:
    """Up/down events of every charon this process talks to, one VICI event connection each.

    Args:
        metrics: each wait's outcome (``qoss_sa_reports_total``: ``reported`` or ``missed``).
        listen: makes the listener of one socket (default: an :class:`EventListener` for
            ``ike-updown`` and ``child-updown``); the seam for tests.
        clock: a monotonic clock, for the retry spacing.
        detached: whether a set-up may initiate without waiting in a charon whose reports arrive
            (:meth:`detached`).
    """

    def __init__(self, *, metrics: Metrics = NO_METRICS,
                 listen: Callable[[str, Callable[[SaEvent], None]], EventListener] | None = None,
                 clock: Callable[[], float] = time.monotonic, detached: bool = True) -> None:
        self._metrics = metrics
        self._detached = detached
        self._listen = listen or updown_listener
        self._clock = clock
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()  # one listener start at a time (they connect to charon)
        self._sockets: dict[str, _Socket] = {}
        self._closed = False
        #: How many expected set-ups charon's event reported up, and how many waits ended without one.
        self.reported = 0
        self.missed = 0

    @property
    def waiting(self) -> int:
        """Set-ups waiting for a report now: none once every set-up has returned."""
        with self._lock:
            return sum(len(waiters) for sock in self._sockets.values() for waiters in sock.waiters.values())

    # -------------------------------------------------------------- listeners

    def _socket(self, path: str) -> _Socket:
        with self._lock:
            return self._sockets.setdefault(path, _Socket())

    def _ensure(self, path: str, *, retry: bool) -> bool:
        """Whether ``path``'s listener runs, starting it if it does not.

        ``retry``: start it even if the last try failed a moment ago (the monitor's resync).

        Raises:
            GatewayError: with ``retry``, when it cannot be started.
        """
        sock = self._socket(path)
        if sock.listener is not None and sock.listener.running:
            return True
        if not retry and sock.failed_at is not None and self._clock() - sock.failed_at < RETRY_AFTER:
            return False
        with self._start_lock:
            if self._closed:
                return False
            if sock.listener is not None and sock.listener.running:
                return True
            listener = self._listen(path, lambda event: self._deliver(sock, event))
            try:
                listener.start()
            except GatewayError as exc:
                sock.failed_at = self._clock()
                _log.info("no SA events from %s: %s", path, exc.message)
                if retry:
                    raise
                return False
            sock.listener, sock.failed_at = listener, None
            return True

    def _deliver(self, sock: _Socket, event: SaEvent) -> None:
        with self._lock:
            subscribers = list(sock.subscribers)
            waiters: list[_Waiter] = []
            if event.kind is EventKind.CHILD_UPDOWN and event.up and event.ike_sa is not None \
                    and any(child.name == event.ike_name for child in event.children):
                waiters = sock.waiters.pop(event.ike_name, [])
        # The subscribers first (the tunnel monitor only schedules a check): a set-up woken by
        # this report is answered only once the monitor knows of the event that verified it.
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # one subscriber's failure is not the others'
                _log.exception("SA event subscriber failed for %s %s", event.kind.value, event.ike_name)
        for waiter in waiters:
            waiter.sa = event.ike_sa
            waiter.arrived.set()

    def close(self) -> None:
        """Stop every listener (the process is stopping)."""
        with self._start_lock:
            self._closed = True
            with self._lock:
                listeners = [s.listener for s in self._sockets.values() if s.listener is not None]
            for listener in listeners:
                listener.stop(timeout=1.0)

    # -------------------------------------------------------------- set-ups

    @contextlib.contextmanager
    def expect(self, socket_path: str, ike: str) -> Iterator[Callable[[float], IkeSa | None]]:
        """Register for the report of conn ``ike``'s CHILD_SA coming up on ``socket_path``;
        the value is ``wait(timeout)``: that report's IKE_SA (with its CHILD_SAs), or None if
        none came within ``timeout`` seconds or there is no listener. Enter before initiating."""
        waiter = _Waiter(ike)
        listening = self._ensure(socket_path, retry=False)
        sock = self._socket(socket_path)
        if listening:
            with self._lock:
                sock.waiters.setdefault(ike, []).append(waiter)

        def wait(timeout: float) -> IkeSa | None:
            if listening and waiter.arrived.wait(timeout):
                with self._lock:
                    self.reported += 1
                self._metrics.count("qoss_sa_reports_total", outcome="reported")
                return waiter.sa
            with self._lock:
                self.missed += 1
            self._metrics.count("qoss_sa_reports_total", outcome="missed")
            return None

        try:
            yield wait
        finally:
            with self._lock:
                pending = sock.waiters.get(ike)
                if pending is not None and waiter in pending:
                    pending.remove(waiter)
                    if not pending:
                        del sock.waiters[ike]

    def detached(self, socket_path: str) -> bool:
        """Whether a set-up on ``socket_path`` may initiate without waiting in charon: allowed,
        and that charon's reports arrive (its listener runs, or starts now)."""
        return self._detached and self._ensure(socket_path, retry=False)

    # -------------------------------------------------------------- the monitor

    def listener(self, socket_path: str, callback: Callable[[SaEvent], None]) -> Subscription:
        """A subscription to ``socket_path``'s events with the interface of the tunnel
        monitor's listeners (``app.services.tunnel_monitor.ListenerFactory``)."""
        return Subscription(self, socket_path, callback)

    def _subscribe(self, path: str, callback: Callable[[SaEvent], None]) -> None:
        self._ensure(path, retry=True)
        sock = self._socket(path)
        with self._lock:
            if callback not in sock.subscribers:  # a subscription made again after the listener died
                sock.subscribers.append(callback)

    def _unsubscribe(self, path: str, callback: Callable[[SaEvent], None]) -> None:
        sock = self._socket(path)
        with self._lock:
            if callback in sock.subscribers:
                sock.subscribers.remove(callback)

    def _running(self, path: str) -> bool:
        listener = self._socket(path).listener
        return listener is not None and listener.running


class Subscription:
    """The events of one socket for one callback, through the hub's shared listener."""

    def __init__(self, hub: SaEventHub, socket_path: str, callback: Callable[[SaEvent], None]) -> None:
        self._hub, self.socket_path, self._callback = hub, socket_path, callback
        self._active = False

    @property
    def running(self) -> bool:
        """Subscribed, and the shared listener is alive (if it died, events are being missed)."""
        return self._active and self._hub._running(self.socket_path)

    def start(self) -> None:
        """Subscribe, starting the socket's listener if it does not run.

        Raises:
            GatewayError: the listener cannot be started (charon unreachable, no event support).
        """
        self._hub._subscribe(self.socket_path, self._callback)
        self._active = True

    def stop(self, timeout: float = 1.0) -> None:
        """Unsubscribe (the shared listener goes on for the others)."""
        del timeout  # nothing to wait for: the listener is not this subscription's
        self._active = False
        self._hub._unsubscribe(self.socket_path, self._callback)
