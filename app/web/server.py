"""The HTTP server ``qoss serve`` runs: uvicorn's, told first when it is asked to stop, and
holding at most ``max_connections`` connections at once.

**The connection bound.** Left to itself the event loop accepts every connection the kernel
has queued, so a burst of 3,000 clients becomes 3,000 transports, parsers, scopes and tasks
alive at once, most of them only to be answered 503 by admission control; the memory they take
at their peak is what the process keeps afterwards (docs/performance.md, "Under a burst").
With a bound, :class:`_Server` accepts on its own listening socket (``loop.add_reader`` and
``loop.connect_accepted_socket``, both public) and hands connections to uvicorn while fewer
than ``max_connections`` are open, and again as soon as one closes: the rest wait in the
waiting room (below), then in the kernel's listen backlog (``listen_backlog``), and are
answered in turn. uvicorn then serves each connection handed to it as it does its own; what
of it this relies on beyond its documented API
(``Server.startup(sockets=[])`` listening on nothing, ``Config.http_protocol_class`` and its
keyword arguments, ``server_state.connections``, ``lifespan.state``) is exercised by
``tests/api/test_connection_bound.py``, on asyncio and uvloop, so an upgrade that changes it
fails there. ``max_connections=0`` is uvicorn's own accepting, untouched.

**The waiting room.** A health checker opens a new connection per check (HAProxy's
``httpchk``, Kubernetes' probes); behind a burst in the backlog it would wait seconds. So at
the bound :class:`_Server` goes on accepting, up to ``waiting_room`` more connections, and
holds each as a bare socket, its only cost a socket object and a place in a dict (about
100 bytes; the kernel keeps what the client sent): no transport, no parser, no task. It peeks
(``MSG_PEEK``, from a reader callback) at the first bytes of each: a request line
``GET /healthz``, ``GET /livez`` or ``GET /metrics`` is handed to uvicorn at once, beyond the
bound (by at most ``_PROBE_ROOM``: probes are short); any other request waits in the room and is
handed over in the order its first bytes came as places free, as the backlog would have done.
A connection that sends nothing for ``silent_timeout`` seconds is closed (a connection that
has sent its request waits its turn however long), one whose first segment ends before its
request line says what it is waits as an ordinary request, and on shutdown every waiting
socket is closed. When the room is full the listening socket is not read until it has space:
the backlog holds the rest, as without it. ``waiting_room=0`` turns it off. What it pays
(docs/performance.md, "Under a burst"): ``/healthz`` on a new connection within 0.75 s during
3,000-request bursts on 2 cores, against 9 to 13 s behind the backlog, for 1 MB more at the
peak (RSS 30 s after 1.06-1.07 times the start, against 1.05-1.06).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

__all__ = ["serve"]

log = logging.getLogger("uvicorn.error")

#: Seconds before accepting again after the process ran out of descriptors or memory (asyncio's own).
_ACCEPT_RETRY = 1.0
#: The request lines answered from the waiting room at once, each followed by " " or "?".
_PROBES = (b"GET /healthz", b"GET /livez", b"GET /metrics")
_PEEK = max(len(p) for p in _PROBES) + 1
#: Connections by which probes may exceed the bound; more probes wait first in line for a place.
_PROBE_ROOM = 16


def _is_probe(head: bytes) -> bool:
    """Whether ``head``, a connection's first bytes, begins a request for a probe's path."""
    return any(head.startswith(p) and head[len(p):len(p) + 1] in (b" ", b"?") for p in _PROBES)


class _Server(uvicorn.Server):
    """On SIGTERM or SIGINT the application is told it is draining before uvicorn stops taking
    requests: open event streams end then (their clients resume elsewhere with Last-Event-ID),
    so the shutdown waits only for the requests in progress, not for every follower to leave.

    With ``max_connections`` above 0 it holds at most that many connections open at once, and
    up to ``waiting_room`` more as bare sockets, probes among them answered at once (see the
    module's docstring); ``most_open`` is the highest number it held, ``probes_early`` how many
    probes it handed over from the waiting room and ``silent_closed`` how many silent
    connections it closed there.
    """

    def __init__(self, config: uvicorn.Config, application: FastAPI, *, max_connections: int = 0,
                 waiting_room: int = 0, silent_timeout: float = 10.0) -> None:
        super().__init__(config)
        self._application = application
        self.max_connections = max_connections
        self.waiting_room = waiting_room if max_connections else 0
        self.silent_timeout = silent_timeout
        self.most_open = 0
        self.probes_early = 0
        self.silent_closed = 0
        self._listener: socket.socket | None = None
        self._accepting = False
        self._connecting = 0  # accepted, the protocol not yet told (connection_made)
        self._protocol: Callable[[], asyncio.Protocol] | None = None
        self._connects: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)
        # The waiting room: sockets not yet heard from (a reader on each) by when they were
        # accepted, then probes and other requests in the order their first bytes came.
        self._silent: dict[socket.socket, float] = {}
        self._probes: deque[socket.socket] = deque()
        self._ready: deque[socket.socket] = deque()
        self._sweep: asyncio.TimerHandle | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._application.state.draining = True
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.max_connections or sockets is not None:
            await super().startup(sockets)
            return
        await super().startup(sockets=[])  # the lifespan; uvicorn itself listens on nothing
        if not self.started:
            return
        self.started = False  # not before this server's own socket takes connections
        config = self.config
        family = socket.AF_INET6 if config.host and ":" in config.host else socket.AF_INET
        try:
            listener = socket.create_server((config.host, config.port), family=family, backlog=config.backlog)
        except OSError as exc:
            log.error(exc)
            await self.lifespan.shutdown()
            raise SystemExit(3) from exc  # uvicorn's STARTUP_FAILURE
        listener.setblocking(False)
        self._listener = listener
        self._protocol = self._counted_protocol()
        log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit); at most %d connections at once, "
                 "%d more waiting", *listener.getsockname()[:2], self.max_connections, self.waiting_room)
        self._resume()
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            self._pause(listener)
            listener.close()
        self._close_waiting()
        await super().shutdown(sockets)

    def _counted_protocol(self) -> Callable[[], asyncio.Protocol]:
        """uvicorn's protocol for a connection (as its own ``startup`` makes it), which lets this
        server accept again once the connection is closed."""
        config, state, app_state, on_close = self.config, self.server_state, self.lifespan.state, self._resume
        base: Any = config.http_protocol_class

        class Counted(base):  # type: ignore[misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                on_close()

        return lambda: Counted(config=config, server_state=state, app_state=app_state)

    def _open(self) -> int:
        return len(self.server_state.connections) + self._connecting

    def _waiting(self) -> int:
        return len(self._silent) + len(self._probes) + len(self._ready)

    def _resume(self) -> None:
        """A place or a room's space may have freed: hand over who waits, read the listening socket again."""
        while self._open() < self.max_connections and (self._probes or self._ready):
            self._hand((self._probes or self._ready).popleft())
        if (not self._accepting and self._listener is not None
                and (self._open() < self.max_connections or self._waiting() < self.waiting_room)):
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)
            self._accepting = True

    def _pause(self, listener: socket.socket) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            self._accepting = False

    def _accept(self) -> None:
        """The listening socket is readable: accept up to the bound and into the waiting room
        while it has space, then stop reading it."""
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        while self._open() < self.max_connections or self._waiting() < self.waiting_room:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors or memory: the queued wait, as asyncio does
                log.error("accepting a connection failed, trying again in %g s: %s", _ACCEPT_RETRY, exc)
                self._pause(listener)
                loop.call_later(_ACCEPT_RETRY, self._resume)
                return
            conn.setblocking(False)
            if self._open() < self.max_connections:
                self._hand(conn)
            else:
                self._silent[conn] = time.monotonic()
                loop.add_reader(conn.fileno(), self._peek, conn)
                if self._sweep is None:
                    self._sweep = loop.call_later(self.silent_timeout, self._close_silent)
        self._pause(listener)

    def _peek(self, conn: socket.socket) -> None:
        """A connection in the waiting room sent its first bytes (or left): a probe is handed
        over at once, any other request waits its turn for a place."""
        try:
            head = conn.recv(_PEEK, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            head = b""
        asyncio.get_running_loop().remove_reader(conn.fileno())
        del self._silent[conn]
        if not head:  # it left without a word
            conn.close()
        elif _is_probe(head):
            if self._open() < self.max_connections + _PROBE_ROOM:
                self.probes_early += 1
                self._hand(conn)
            else:
                self._probes.append(conn)
        else:
            self._ready.append(conn)
        self._resume()

    def _close_silent(self) -> None:
        """Close the connections in the waiting room that have sent nothing for ``silent_timeout``."""
        loop = asyncio.get_running_loop()
        self._sweep = None
        oldest = time.monotonic() - self.silent_timeout
        while self._silent:
            conn, accepted = next(iter(self._silent.items()))  # the oldest: the dict is in accepting order
            if accepted > oldest:
                self._sweep = loop.call_later(accepted - oldest, self._close_silent)
                break
            loop.remove_reader(conn.fileno())
            del self._silent[conn]
            self.silent_closed += 1  # counted before the client can see the close
            conn.close()
        self._resume()

    def _close_waiting(self) -> None:
        """Close every socket in the waiting room (the server stops)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        loop = asyncio.get_running_loop()
        for conn in self._silent:
            loop.remove_reader(conn.fileno())
            conn.close()
        for conn in (*self._probes, *self._ready):
            conn.close()
        self._silent.clear()
        self._probes.clear()
        self._ready.clear()

    def _hand(self, conn: socket.socket) -> None:
        """Give an accepted connection to uvicorn's protocol."""
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # as asyncio's transports do; a reset peer is found later
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connecting += 1
        self.most_open = max(self.most_open, self._open())
        task = asyncio.get_running_loop().create_task(self._connect(conn))
        self._connects.add(task)
        task.add_done_callback(self._connects.discard)

    async def _connect(self, conn: socket.socket) -> None:
        assert self._protocol is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self._protocol, conn)
        except OSError:  # the client left before its transport was made
            conn.close()
        finally:
            self._connecting -= 1
            self._resume()


def serve(application: FastAPI, *, host: str, port: int, log_level: str, backlog: int,
          max_connections: int = 0, waiting_room: bool = True, silent_timeout: float = 10.0) -> None:
    """Serve ``application`` until asked to stop (httptools; forwarded headers are qoss's own
    business), holding at most ``max_connections`` connections at once (0: as many as come)
    and, with ``waiting_room``, up to ``backlog`` more as bare sockets, probes answered at once
    and silent ones closed after ``silent_timeout`` seconds (within the process's descriptor limit)."""
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level, http="httptools",
                            proxy_headers=False, backlog=backlog)
    room = min(backlog, _descriptors() - max_connections - _PROBE_ROOM - 64) if waiting_room else 0
    _Server(config, application, max_connections=max_connections, waiting_room=max(0, room),
            silent_timeout=silent_timeout).run()


def _descriptors() -> int:
    """The process's limit on open descriptors (its soft limit; a large number where there is none)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
