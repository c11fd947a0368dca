"""VICI sessions: what the driver needs of one, how one is opened (a UNIX socket only: VICI
over TCP has no authentication), and the pool of idle sessions kept for reuse."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Protocol

import vici
import vici.exception

from app.adapters.sockets import idle_and_open

__all__ = ["POOL", "Connect", "SessionPool", "ViciSession", "unix_connect"]

_log = logging.getLogger(__name__)


class ViciSession(Protocol):
    """What the driver needs of a VICI session (``vici.Session`` has it)."""

    def request(self, command: str, message: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        """Send one command, return its (raw) reply."""
        ...

    def streamed_request(
        self, command: str, event_stream_type: str, message: Mapping[str, Any] | None = None
    ) -> Iterator[Mapping[str, Any]]:
        """Send one command, yield the events it streams, raise if it failed."""
        ...


Connect = Callable[[str, float], AbstractContextManager[ViciSession]]


@contextmanager
def unix_connect(socket_path: str, timeout: float) -> Iterator[ViciSession]:
    """The production :data:`Connect`: a UNIX stream socket wrapped in ``vici.Session``.

    VICI over TCP has no authentication, so only UNIX sockets are supported. A charon
    whose queue of connections not yet accepted is full refuses a new one at once (``EAGAIN``
    on a socket with a timeout); the connect is tried again until ``timeout`` has passed.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                sock.connect(socket_path)
                break
            except BlockingIOError:
                if time.monotonic() + pause > deadline:
                    raise TimeoutError(f"charon did not accept a connection within {timeout:g} s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        session: ViciSession = vici.Session(sock=sock)
        yield session
    finally:
        sock.close()


class _Held:
    """One open session and what closes it (the :data:`Connect` context, kept entered)."""

    __slots__ = ("_stack", "session")

    def __init__(self, connect: Connect, socket_path: str, timeout: float) -> None:
        self._stack = ExitStack()
        self.session: ViciSession = self._stack.enter_context(connect(socket_path, timeout))

    def alive(self) -> bool:
        """False if an idle session's socket has something to read: charon closed it (or sent
        something no one asked for). Sessions without a visible socket count as alive."""
        sock = getattr(getattr(self.session, "transport", None), "socket", None)
        return not isinstance(sock, socket.socket) or idle_and_open(sock)

    def close(self) -> None:
        try:
            self._stack.close()
        except Exception as exc:  # closing must never hide the error that got us here
            _log.debug("closing a VICI session: %s", type(exc).__name__)


class SessionPool:
    """Idle VICI sessions for reuse: at most ``max_idle`` per key (connect seam, socket, timeout)
    and ``max_total`` in all.

    A session is held by one caller at a time: :meth:`take` removes it from the pool and
    :meth:`give` puts it back (or closes it when the pool is full). Thread-safe; a forked
    child starts with an empty pool (the parent's sockets are not its to use).
    """

    def __init__(self, max_idle: int = 16, max_total: int = 128) -> None:
        self.max_idle = max_idle
        self.max_total = max_total
        self._total = 0
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[_Held]] = {}

    def take(self, key: Hashable) -> _Held | None:
        """An idle session still connected, or None; dead ones met on the way are closed."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                held = idle.pop() if idle else None
                self._total -= held is not None
            if held is None or held.alive():
                return held
            _log.debug("dropping a VICI session closed by the other end")
            held.close()

    def give(self, key: Hashable, held: _Held) -> None:
        """Return a session after a command that ended cleanly."""
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle and self._total < self.max_total:
                idle.append(held)
                self._total += 1
                return
        held.close()

    def idle(self, key: Hashable) -> int:
        """How many sessions are idle under ``key``."""
        with self._lock:
            return len(self._idle.get(key, ()))

    def close(self) -> None:
        """Close every idle session (at process exit, or in tests)."""
        with self._lock:
            helds = [h for idle in self._idle.values() for h in idle]
            self._idle.clear()
            self._total = 0
        for held in helds:
            held.close()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._idle = {}
        self._total = 0


#: The pool every :class:`ViciGateway` shares (gateways are cheap and made per use).
POOL = SessionPool()
atexit.register(POOL.close)
os.register_at_fork(after_in_child=POOL._forget)

