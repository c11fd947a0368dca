"""Listening to charon's SA events over a dedicated VICI connection.

A VICI connection that is registered for events must not carry commands, so the
:class:`EventListener` opens its own connection, registers for ``ike-updown``,
``child-updown``, ``ike-rekey`` and ``child-rekey`` (strongSwan >= 5.2.0) and hands
typed :class:`SaEvent` objects to a callback from a background thread.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any

import vici.exception

from app.adapters.vici import wire
from app.adapters.vici.models import ChildSa, IkeSa, decode, parse_child_sa, parse_ike_sa
from app.adapters.vici.session import unix_connect
from app.domain.errors import GatewayError, GatewayRejected, GatewayUnreachable

__all__ = ["EventKind", "EventListener", "ListenConnect", "SaEvent", "parse_event", "updown_listener"]

_log = logging.getLogger(__name__)


class EventKind(StrEnum):
    """The VICI events the listener understands."""

    IKE_UPDOWN = "ike-updown"
    CHILD_UPDOWN = "child-updown"
    IKE_REKEY = "ike-rekey"
    CHILD_REKEY = "child-rekey"


@dataclass(frozen=True, slots=True, kw_only=True)
class SaEvent:
    """One SA event, decoded.

    Attributes:
        kind: which event.
        ike_name: the connection (IKE_SA config) name.
        up: for the up/down events, whether it came up; None for rekeys.
        ike_sa: the IKE_SA (for ``ike-rekey`` the new one).
        old_ike_sa: for ``ike-rekey``, the IKE_SA that was replaced.
        children: for ``child-updown`` the CHILD_SAs concerned, for ``child-rekey`` the new ones.
        old_children: for ``child-rekey``, the CHILD_SAs that were replaced.
    """

    kind: EventKind
    ike_name: str
    up: bool | None
    ike_sa: IkeSa | None
    old_ike_sa: IkeSa | None = None
    children: tuple[ChildSa, ...] = ()
    old_children: tuple[ChildSa, ...] = ()


#: Opens the listener's session; same contract as :data:`app.adapters.vici.session.Connect`.
ListenConnect = Callable[[str, float], Any]


def parse_event(name: str, message: Mapping[str, Any]) -> list[SaEvent]:
    """The typed events in one decoded VICI event message (one per IKE_SA section).

    Unknown event names give an empty list.
    """
    try:
        kind = EventKind(name)
    except ValueError:
        return []
    up = (message.get("up") == "yes") if kind in (EventKind.IKE_UPDOWN, EventKind.CHILD_UPDOWN) else None
    events = []
    for ike_name, body in message.items():
        if not isinstance(body, Mapping):
            continue
        if kind is EventKind.IKE_REKEY:
            old, new = body.get("old"), body.get("new")
            events.append(SaEvent(
                kind=kind, ike_name=ike_name, up=None,
                ike_sa=parse_ike_sa(ike_name, new) if isinstance(new, Mapping) else None,
                old_ike_sa=parse_ike_sa(ike_name, old) if isinstance(old, Mapping) else None,
            ))
        elif kind is EventKind.CHILD_REKEY:
            children = body.get("child-sas")
            pairs = children.items() if isinstance(children, Mapping) else []
            stripped = {k: v for k, v in body.items() if k != "child-sas"}
            news = tuple(parse_child_sa(v["new"], k) for k, v in pairs
                         if isinstance(v, Mapping) and isinstance(v.get("new"), Mapping))
            olds = tuple(parse_child_sa(v["old"], k) for k, v in pairs
                         if isinstance(v, Mapping) and isinstance(v.get("old"), Mapping))
            events.append(SaEvent(kind=kind, ike_name=ike_name, up=None,
                                  ike_sa=parse_ike_sa(ike_name, stripped), children=news, old_children=olds))
        else:
            ike_sa = parse_ike_sa(ike_name, body)
            events.append(SaEvent(kind=kind, ike_name=ike_name, up=up, ike_sa=ike_sa,
                                  children=ike_sa.children if kind is EventKind.CHILD_UPDOWN else ()))
    return events


class EventListener:
    """Delivers charon's SA events to ``callback`` from a background thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The callback runs
    in the listener's thread; an exception it raises is logged and the listener goes on.

    Args:
        socket_path: charon's VICI socket.
        callback: receives every :class:`SaEvent`.
        events: which events to register for (default: all of :class:`EventKind`).
        on_error: receives the mapped error if the connection fails after :meth:`start`.
        connect: the I/O seam (default :func:`~app.adapters.vici.session.unix_connect`).
        timeout: seconds for connecting and registering.
        poll_interval: how often the thread checks whether to stop, in seconds.
        wire: read the events off the session's socket (:mod:`app.adapters.vici.wire`); false
            (``QOSS_FAST_PATHS=false``), or a session without one: the ``vici`` package's ``listen``.
    """

    def __init__(
        self,
        socket_path: str,
        callback: Callable[[SaEvent], None],
        *,
        events: Sequence[EventKind] = tuple(EventKind),
        on_error: Callable[[GatewayError], None] | None = None,
        connect: ListenConnect = unix_connect,
        timeout: float = 10.0,
        poll_interval: float = 0.2,
        wire: bool = True,
    ) -> None:
        self.socket_path = socket_path
        self._wire = wire
        self._callback = callback
        self._events = [EventKind(e).value for e in events]
        self._on_error = on_error
        self._connect = connect
        self._timeout = timeout
        self._poll = poll_interval
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self.error: GatewayError | None = None

    def __repr__(self) -> str:
        return f"EventListener(socket_path={self.socket_path!r}, events={self._events!r})"

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Connect, register, and start delivering; returns once registered.

        Raises:
            GatewayUnreachable: the socket cannot be reached.
            GatewayRejected: charon does not know one of the events.
            RuntimeError: already started.
        """
        if self._thread is not None:
            raise RuntimeError("the listener was started already")
        self._thread = threading.Thread(target=self._run, name=f"vici-events:{self.socket_path}", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._timeout + self._poll + 1.0):
            self.stop()
            raise GatewayUnreachable(self.socket_path, "event registration did not complete")
        if self.error is not None:
            error = self.error
            self.stop()
            raise error

    def stop(self, timeout: float = 5.0) -> None:
        """Unregister, close the connection and wait for the thread to end."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> EventListener:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _map(self, exc: Exception) -> GatewayError:
        if isinstance(exc, GatewayError):
            return exc
        if isinstance(exc, vici.exception.EventUnknownException):
            return GatewayRejected(f"charon does not know an event of {self._events}: {exc}")
        if isinstance(exc, OSError):
            reason = "no such socket" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
            return GatewayUnreachable(self.socket_path, reason or type(exc).__name__)
        return GatewayUnreachable(self.socket_path, f"VICI protocol error while listening: {exc}")

    def _run(self) -> None:
        try:
            with self._connect(self.socket_path, self._timeout) as session:
                sock = getattr(getattr(session, "transport", None), "socket", None)
                if self._wire and isinstance(sock, socket.socket):
                    self._listen_wire(sock)
                    return
                stream = session.listen(list(self._events), timeout=self._poll)
                try:
                    for name, message in stream:
                        self._ready.set()
                        if self._stopping.is_set():
                            break
                        if name is None:
                            continue
                        self._deliver(decode(name), decode(message))
                finally:
                    stream.close()
        except Exception as exc:
            if self._stopping.is_set():
                _log.debug("event listener on %s stopped: %s", self.socket_path, exc)
                return
            self.error = self._map(exc)
            _log.warning("event listener on %s failed: %s", self.socket_path, self.error.message)
            if self._ready.is_set() and self._on_error is not None:
                self._on_error(self.error)
        finally:
            self._ready.set()

    def _listen_wire(self, sock: socket.socket) -> None:
        """What ``Session.listen`` does, on the session's socket (:mod:`app.adapters.vici.wire`):
        register, deliver until stopped, unregister."""
        reader = wire.PacketReader(sock)
        sock.settimeout(self._timeout)
        for name in self._events:
            sock.sendall(wire.packet(wire.EVENT_REGISTER, name))
            self._confirmed(reader, name)
        self._ready.set()
        sock.settimeout(self._poll)
        while not self._stopping.is_set():
            found = reader.next()
            if found is not None and found[0] == wire.EVENT and found[1] is not None:
                self._deliver(found[1], wire.read_message(found[2]))
        sock.settimeout(self._timeout)
        for name in self._events:
            sock.sendall(wire.packet(wire.EVENT_UNREGISTER, name))
            self._confirmed(reader, name)

    def _confirmed(self, reader: wire.PacketReader, name: str) -> None:
        """Wait for charon's answer to a (un)registration of ``name``; events before it are delivered."""
        while True:
            found = reader.next()
            if found is None:
                raise TimeoutError(f"charon did not confirm the {name} registration")
            kind, event, message = found
            if kind == wire.EVENT_CONFIRM:
                return
            if kind == wire.EVENT_UNKNOWN:
                raise vici.exception.EventUnknownException(f"Unknown event type '{name}'")
            if kind == wire.EVENT and event is not None:
                self._deliver(event, wire.read_message(message))

    def _deliver(self, name: str, message: Mapping[str, Any]) -> None:
        for event in parse_event(name, message):
            try:
                self._callback(event)
            except Exception:
                _log.exception("event callback failed for %s %s", event.kind.value, event.ike_name)


def updown_listener(socket_path: str, callback: Callable[[SaEvent], None], *, wire: bool = True) -> EventListener:
    """A listener (not yet started) for ``ike-updown`` and ``child-updown`` on one charon: the
    one :class:`~app.adapters.vici.sa_events.SaEventHub` keeps per charon."""
    return EventListener(socket_path, callback, events=(EventKind.IKE_UPDOWN, EventKind.CHILD_UPDOWN), timeout=5.0,
                         wire=wire)
