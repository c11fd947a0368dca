"""Tunnel state from charon's own events: a tunnel that goes down is shown ``down``.

One event listener per registered gateway (production: the process's shared one,
``app.adapters.vici.sa_events``, on a VICI connection of its own that never carries commands)
receives ``ike-updown`` and ``child-updown``. An event about a ``qoss-*`` connection only
*schedules* a check of that tunnel a short ``settle`` time later (on the next ``tick``: the
checks due together have their states read at once); a tunnel that is ``down``, or ``up``
with a down event among its events, is read in full and every managed end's ``list-sas``
asked whether the SA is ESTABLISHED with its CHILD_SA INSTALLED, and recorded ``up`` or
``down`` accordingly. Checking instead of trusting one
event makes the outcome independent of event order and of the service's own set-ups,
teardowns and reconciles (whose events arrive while those run): by the time the check
runs, a deleted tunnel has no record and a restored one is established again.

Listeners are kept in step with the gateway table every ``resync`` seconds, so a gateway
registered later is watched too and a listener whose charon restarted is reconnected;
each time a listener (re)connects, every tunnel on that gateway is checked once, since
its events until then were not seen: their records are read a page at a time, then one
``list-sas`` of each charon involved answers for all of them. A gateway whose charon does not
answer is tried again at the next look, then after 2, 4, 8 ... looks, at most every
``retry_max`` seconds, until it answers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from app.domain.charon_port import ViciFactory
from app.domain.errors import GatewayError, NotFound
from app.domain.ports import NO_METRICS, Metrics, UnitOfWorkFactory
from app.domain.tunnels import TunnelState
from app.services.background import Worker
from app.services.tunnel_setup import established_conns, established_everywhere
from app.services.tunnels import every_tunnel

__all__ = ["UPDOWN", "Listener", "ListenerFactory", "SaNotice", "TunnelMonitor"]

log = logging.getLogger("qoss.monitor")

_PREFIX = "qoss-"
#: Records read at once when every tunnel on a gateway is checked.
_CHECK_PAGE = 1000


#: The SA events the monitor acts on (VICI's names).
UPDOWN = ("ike-updown", "child-updown")


class SaNotice(Protocol):
    """What the monitor reads of one SA event (``app.adapters.vici.events.SaEvent`` has it)."""

    @property
    def kind(self) -> str:
        """The VICI event name, e.g. ``ike-updown``."""
        ...

    @property
    def ike_name(self) -> str:
        """The connection it is about."""
        ...

    @property
    def up(self) -> bool | None:
        """For up/down events whether it came up."""
        ...


class Listener(Protocol):
    """What the monitor needs of an event listener (``app.adapters.vici.events.EventListener`` has it)."""

    @property
    def running(self) -> bool:
        """Whether it still delivers events."""
        ...

    def start(self) -> None:
        """Connect and register; raises :class:`GatewayError` if charon cannot be reached."""
        ...

    def stop(self, timeout: float = ...) -> None:
        """Unregister and close."""
        ...


#: (socket path, callback) -> a listener not yet started.
ListenerFactory = Callable[[str, Callable[[SaNotice], None]], Listener]


class TunnelMonitor:
    """Watches every gateway's SA events and keeps the tunnel records' ``up``/``down`` true.

    Args:
        units: units of work on the service's database (the monitor commits its own).
        reads: read-only units of work for what it only reads (default: ``units``).
        vici: socket path -> VICI gateway, for the ``list-sas`` checks.
        listen: makes an event listener for a socket (production: a VICI connection that
            delivers ``ike-updown`` and ``child-updown``).
        settle: seconds between an event and the check it triggers (rounded up to ``tick``).
        tick: the checks due within one tick run together (their states read at once).
        resync: seconds between re-reading the gateways (and reconnecting lost listeners).
        retry_max: the longest wait, in seconds, between two tries of a gateway whose charon
            does not answer (the waits double from one look).
        metrics: each check's lag behind the first event that asked for it
            (``qoss_monitor_lag_seconds``, the settle time included).
    """

    def __init__(
        self,
        *,
        units: UnitOfWorkFactory,
        vici: ViciFactory,
        listen: ListenerFactory,
        reads: UnitOfWorkFactory | None = None,
        settle: float = 1.0,
        tick: float = 0.25,
        resync: float = 5.0,
        retry_max: float = 300.0,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._metrics = metrics
        self._units = units
        self._reads = reads or units
        self._vici = vici
        self._listen = listen
        self._settle = settle
        self._tick = tick
        self._resync = resync
        self._listeners: dict[str, Listener] = {}
        #: Looks at a gateway whose charon did not answer: socket -> (failures in a row, looks to skip)
        self._failing: dict[str, tuple[int, int]] = {}
        self._skip_max = max(0, math.ceil(retry_max / resync) - 1)
        #: tunnel id -> (when to check, whether a down event was among its events)
        self._due: dict[str, tuple[float, bool]] = {}
        #: tunnel id -> when the first event of its pending check arrived
        self._first_seen: dict[str, float] = {}
        #: how many of the tunnels taken off ``_due`` are being checked now
        self._checking = 0
        self._worker = Worker("monitor")
        self._wake = self._worker.wake
        #: How many checks changed a record (for tests and logs).
        self.changes = 0

    def start(self) -> None:
        """Start watching (returns at once; listeners connect in the monitor's thread)."""
        self._worker.start(("qoss-tunnel-monitor", self._run))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every listener and the monitor's thread."""
        self._worker.stop(timeout)
        for listener in list(self._listeners.values()):
            listener.stop(timeout=1.0)
        self._listeners.clear()

    @property
    def pending(self) -> int:
        """Tunnels with a check scheduled or running: none once every event so far is dealt with."""
        with self._wake:
            return len(self._due) + self._checking

    @property
    def watched(self) -> list[str]:
        """The VICI sockets with a live listener."""
        return sorted(path for path, listener in self._listeners.items() if listener.running)

    # ------------------------------------------------------------------ events

    def on_event(self, event: SaNotice) -> None:
        """Schedule a check of the tunnel an up/down event is about (other events are ignored)."""
        if event.kind not in UPDOWN:
            return
        if not event.ike_name.startswith(_PREFIX):
            return
        tunnel_id = event.ike_name[len(_PREFIX):]
        with self._wake:
            now = time.monotonic()
            pending = self._due.get(tunnel_id)
            if pending is None:
                # Due on the next tick after the settle time, so that the checks of a burst of
                # set-ups (4 events each) are read together, one batch per tick.
                at = math.ceil((now + self._settle) / self._tick) * self._tick
                if not self._due:  # the loop waits for nothing sooner: tell it
                    self._wake.notify_all()
                # Otherwise it wakes by the earliest check due, never later than this one (same
                # settle time, later event): waking it for each event of a burst made it look at
                # every pending check once per event.
                self._due[tunnel_id] = (at, event.up is False)
                self._first_seen[tunnel_id] = now
            elif event.up is False and not pending[1]:
                self._due[tunnel_id] = (pending[0], True)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        next_sync = 0.0  # watch the gateways at once
        while True:
            with self._wake:
                while True:
                    if self._worker.stopping:
                        return
                    now = time.monotonic()
                    due = [(t, down) for t, (at, down) in self._due.items() if at <= now]
                    if due or now >= next_sync:
                        break
                    self._wake.wait(min([next_sync, *(at for at, _ in self._due.values())]) - now)
                seen = {tunnel_id: self._first_seen.pop(tunnel_id, now) for tunnel_id, _ in due}
                for tunnel_id, _ in due:
                    del self._due[tunnel_id]
                self._checking = len(due)
            for tunnel_id, _ in due:
                self._metrics.observe("qoss_monitor_lag_seconds", time.monotonic() - seen[tunnel_id])
            if due:
                self._guarded(self._check_due, due)
                with self._wake:
                    self._checking = 0
            if time.monotonic() >= next_sync:
                self._guarded(self.sync_listeners)
                next_sync = time.monotonic() + self._resync

    def _guarded(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # the monitor must outlive any one failure; the next event retries
            log.exception("tunnel monitor: %s failed", getattr(fn, "__name__", fn))

    def sync_listeners(self) -> None:
        """Watch every registered gateway; reconnect listeners that stopped; drop removed ones."""
        with self._reads() as uow:
            sockets = {g.vici_socket for g in uow.gateways.list()}
        for path in sorted(set(self._listeners) - sockets):
            self._listeners.pop(path).stop(timeout=1.0)
        for path in sorted(set(self._failing) - sockets):
            del self._failing[path]
        for path in sorted(sockets):
            current = self._listeners.get(path)
            if current is not None and current.running:
                continue
            failures, skip = self._failing.get(path, (0, 0))
            if skip:
                self._failing[path] = (failures, skip - 1)
                continue
            listener = self._listen(path, self.on_event)
            try:
                listener.start()
            except GatewayError as exc:
                self._listeners.pop(path, None)
                skip = min(2 ** failures - 1, self._skip_max)  # tries at looks 1, 2, 4, 8 ... from the first
                self._failing[path] = (failures + 1, skip)
                log.info("tunnel monitor: not watching %s yet (%d tries; the next in %g s): %s",
                         path, failures + 1, (skip + 1) * self._resync, exc.message)
                continue
            self._failing.pop(path, None)
            self._listeners[path] = listener
            # Events before this moment were not seen (a new gateway, a restarted charon).
            self.check_all_on(path)

    def check_all_on(self, socket_path: str) -> None:
        """Check every ``up`` or ``down`` tunnel with an end on ``socket_path`` (its events until
        now were not seen). The records are read first, a page at a time (only what the check
        needs of each is kept), then one ``list-sas`` of each charon involved answers for all of
        them: asking per tunnel made charon walk every IKE_SA it holds once per tunnel and end."""
        with self._reads() as uow:
            sockets = {g.name: g.vici_socket for g in uow.gateways.list()}
        todo: list[tuple[str, str, TunnelState, list[str]]] = []  # id, conn, state as read, its ends' sockets
        for record in every_tunnel(self._reads, page=_CHECK_PAGE):
            ends = [sockets.get(name) for name in (record.initiator, record.responder) if name is not None]
            if record.state in (TunnelState.UP, TunnelState.DOWN) and socket_path in ends and None not in ends:
                todo.append((record.id, record.conn, record.state, [e for e in ends if e is not None]))
        established: dict[str, set[str] | None] = {}  # socket -> its conns that are up (None: no answer)
        for path in sorted({path for *_, paths in todo for path in paths}):
            try:
                established[path] = established_conns(self._vici(path).list_sas())
            except GatewayError as exc:
                log.info("tunnel monitor: %s not asked: %s", path, exc.message)
                established[path] = None
        for tunnel_id, conn, state, paths in todo:
            seen = [established[path] for path in paths]
            if all(conns is not None for conns in seen):  # a charon that does not answer says nothing
                self._guarded(self._record, tunnel_id, state, all(conns is not None and conn in conns
                                                                  for conns in seen))

    def _check_due(self, due: list[tuple[str, bool]]) -> None:
        """:meth:`check` the tunnels ``due`` (id, whether a down event was among its events)
        whose state asks for it, the states of all read at once: most checks are of a
        set-up's up events on a tunnel that is ``up``, and end there."""
        with self._reads() as uow:
            states = uow.tunnels.states([tunnel_id for tunnel_id, _ in due])
        for tunnel_id, down in due:
            if _worth_checking(states.get(tunnel_id), down):
                self._guarded(self.check, tunnel_id, down)

    def check(self, tunnel_id: str, down_seen: bool = True) -> None:
        """Record ``up`` or ``down`` for one tunnel from what its managed ends' ``list-sas`` say.

        Only tunnels that are ``up`` or ``down`` move; requested, configuring and failed
        ones belong to the request or reconcile that handles them. Without a down event
        (``down_seen``) an ``up`` tunnel is left unasked: set-ups and restores, which
        bring many up events, cost charon nothing extra. The record is read, and charon
        asked, outside any write transaction; the change is written only if the record
        still is as it was read (a move, a delete or a set-up in the meantime wins).
        """
        with self._reads() as uow:
            try:
                record = uow.tunnels.get(tunnel_id)
            except NotFound:
                return  # deleted, or a set-up that was rolled back
            if not _worth_checking(record.state, down_seen):
                return
            gateways = uow.gateways
            ends = [gateways.get(record.initiator)]
            if record.responder is not None:
                ends.append(gateways.get(record.responder))
        try:
            alive = established_everywhere(self._vici, ends, record.conn)
        except GatewayError as exc:
            log.info("tunnel monitor: %s not checked: %s", tunnel_id, exc.message)
            return
        self._record(tunnel_id, record.state, alive)

    def _record(self, tunnel_id: str, was: TunnelState, alive: bool) -> None:
        """Record what charon said of a tunnel read in state ``was``, if that changes its state
        and the record still is in ``was`` (a move, a delete or a set-up in the meantime wins)."""
        new = TunnelState.UP if alive else TunnelState.DOWN
        if new is was:
            return
        detail = "SA established again (charon event)" if alive else "SA went down (charon event)"
        with self._units() as uow:
            tunnels = uow.tunnels
            try:
                if tunnels.get(tunnel_id).state is not was:
                    return
                tunnels.set_state(tunnel_id, new, detail)
            except NotFound:
                return
            uow.events.append("tunnel.state", tunnel_id, {"state": new.value, "detail": detail},
                              scope="tunnels:read")
            uow.commit()
        self.changes += 1
        log.info("tunnel %s is %s: %s", tunnel_id, new.value, detail)


def _worth_checking(state: TunnelState | None, down_seen: bool) -> bool:
    """Whether a tunnel in ``state`` (None: no record) is to be asked of charon after its events."""
    if state not in (TunnelState.UP, TunnelState.DOWN):
        return False  # gone, or the request or reconcile handling it decides
    return state is TunnelState.DOWN or down_seen
