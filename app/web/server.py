"""The HTTP server ``qoss serve`` runs: uvicorn's, told first when it is asked to stop, holding at
most ``max_connections`` connections at once, and giving no client more than its share of them
or more than a deadline to send its request.

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

**A whole request head before a place.** A connection is handed to uvicorn only once its
request head (request line and headers, up to ``_HEAD_MAX`` bytes) is in: until then
:class:`_Server` reads it itself, from a reader callback on the bare socket, and keeps what it
read. So a client that sends its head a line at a time holds no place: 260 of them, one header
line every 4 s, once held every place of the default bound and kept every other client waiting
for as long as they went on. A connection that has sent nothing within ``silent_timeout``
seconds, or not its whole head within ``header_timeout`` seconds of being accepted (in total,
not per line), is closed (with ``408`` if it had begun); 431 for a head over ``_HEAD_MAX``.
When every socket the server may hold is taken, the oldest connection still sending its head
after ``_EVICT_AFTER`` seconds is closed to accept the next (a client that sends its head at
once is never the oldest for long). The head read is handed to uvicorn's protocol as the
first data of its connection (from its ``connection_made``, before the transport reads the
socket): ``asyncio.Protocol``'s own interface.

**Deadlines inside uvicorn.** On a kept-alive connection the next request's head, and any
request's body, arrive after the connection was handed over; and an answer may wait on a
client that does not read it: :func:`app.web.deadlines.deadline_protocol` gives uvicorn's
protocol a deadline for each head, body and delivery, and a size limit for every head.

**A share per source.** With ``max_connections_per_source`` a client address (an IPv6 /64)
holds at most that many connections, open or waiting; the next from it is answered 503 with
``Retry-After`` and closed at once. The address is the socket's peer: :func:`serve` counts
neither the ``trusted_proxies`` (their clients' addresses are only known further in) nor
loopback addresses (a reverse proxy on the same host).

**The waiting room.** A health checker opens a new connection per check (HAProxy's
``httpchk``, Kubernetes' probes); behind a burst in the backlog it would wait seconds. So at
the bound :class:`_Server` goes on accepting, up to ``waiting_room`` more connections, and
holds each as a bare socket, its only cost a socket object, a place in a dict and the head it
sent (a few hundred bytes, at most ``_HEAD_MAX``): no transport, no parser, no task. A request
for ``GET /healthz``, ``GET /livez`` or ``GET /metrics`` is handed to uvicorn at once, beyond
the bound (by at most ``_PROBE_ROOM``: probes are short); any other request waits in the room
and is handed over in the order its head came as places free, as the backlog would have done.
A connection that has sent its request waits its turn however long, and on shutdown every
waiting socket is closed. When the room is full of requests the listening socket is not read
until it has space: the backlog holds the rest, as without it. ``waiting_room=0`` turns it
off. While every place is held and a request has waited for one ``busy_after`` seconds,
:meth:`_Server.not_ready` says so and ``/healthz`` answers 503, so that a load balancer sends
elsewhere. What it pays (docs/performance.md, "Under a burst"): ``/healthz`` on a new
connection within 0.75 s during 3,000-request bursts on 2 cores, against 9 to 13 s behind the
backlog, for 1 MB more at the peak (RSS 30 s after 1.06-1.07 times the start, against
1.05-1.06).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from app.web.deadlines import HEAD_LATE as _HEAD_LATE
from app.web.deadlines import HEAD_MAX as _HEAD_MAX
from app.web.deadlines import HEAD_TOO_LARGE as _HEAD_TOO_LARGE
from app.web.deadlines import answer, deadline_protocol
from app.web.log_redaction import install_query_secret_filter

__all__ = ["deadline_protocol", "serve"]

log = logging.getLogger("uvicorn.error")

#: Seconds before accepting again after the process ran out of descriptors or memory (asyncio's own).
_ACCEPT_RETRY = 1.0
#: Connections accepted in one go before the loop does anything else (a flood cannot hold it).
_ACCEPTS_AT_ONCE = 256
#: The request lines answered from the waiting room at once, each followed by " " or "?".
_PROBES = (b"GET /healthz", b"GET /livez", b"GET /metrics")
#: Connections by which probes may exceed the bound; more probes wait first in line for a place.
_PROBE_ROOM = 16
#: Seconds a connection may send its head before it may be closed to make room for another.
_EVICT_AFTER = 1.0
#: Networks of a proxy on the same host, never limited per source.
_LOOPBACK = ("127.0.0.0/8", "::1/128")
#: Bytes of unread answers the kernel holds for one connection (Linux doubles it).
_SEND_BUFFER = 256 * 1024
#: Seconds a request must have waited for a place before the server says it is not ready.
_BUSY_AFTER = 1.0


def _is_probe(head: bytes | bytearray) -> bool:
    """Whether ``head``, a connection's first bytes, begins a request for a probe's path."""
    return any(head.startswith(p) and head[len(p):len(p) + 1] in (b" ", b"?") for p in _PROBES)


def _head_end(data: bytes | bytearray, start: int) -> int:
    """Where the request head in ``data`` ends (the index past its empty line), looking from
    ``start``; -1 while it has not ended."""
    ends = [i + n for i, n in ((data.find(b"\n\r\n", start), 3), (data.find(b"\n\n", start), 2)) if i >= 0]
    return min(ends) if ends else -1


_TOO_MANY = answer(503, "Service Unavailable", "Overloaded",
                   "this address holds as many connections as it may: retry shortly", retry_after=1)


def _send_closing(conn: socket.socket, answer: bytes) -> None:
    """Send ``answer`` on ``conn`` as far as its buffer takes it, then close it."""
    with contextlib.suppress(OSError):
        conn.send(answer)
    conn.close()


class _Head:
    """A connection the server reads itself until its request head is in."""

    __slots__ = ("accepted", "data", "ready_at", "source")

    def __init__(self, accepted: float, source: str | None) -> None:
        self.accepted = accepted
        self.source = source
        self.data = bytearray()
        self.ready_at = 0.0


class _Server(uvicorn.Server):
    """On SIGTERM or SIGINT the application is told it is draining before uvicorn stops taking
    requests: open event streams end then (their clients resume elsewhere with Last-Event-ID),
    so the shutdown waits only for the requests in progress, not for every follower to leave.

    With ``max_connections`` above 0 it holds at most that many connections open at once, each
    handed over with its request head in, and up to ``waiting_room`` more as bare sockets,
    probes among them answered at once (see the module's docstring). Counts: ``most_open`` is
    the highest number it held, ``probes_early`` how many probes it handed over from the waiting
    room, ``silent_closed`` how many connections it closed that sent nothing within
    ``silent_timeout``, ``slow_closed`` how many it closed with their head incomplete after
    ``header_timeout``, ``evicted`` how many of those it closed early to accept another, and
    ``refused`` how many it refused beyond ``max_connections_per_source`` (sources in the
    ``uncounted`` networks are not limited).
    """

    def __init__(self, config: uvicorn.Config, application: FastAPI, *, max_connections: int = 0,
                 waiting_room: int = 0, silent_timeout: float = 10.0, header_timeout: float = 10.0,
                 max_connections_per_source: int = 0, uncounted: Sequence[str] = (),
                 busy_after: float = _BUSY_AFTER) -> None:
        super().__init__(config)
        self._application = application
        self.max_connections = max_connections
        self.waiting_room = waiting_room if max_connections else 0
        self.silent_timeout = silent_timeout
        self.header_timeout = header_timeout
        self.max_connections_per_source = max_connections_per_source
        self.busy_after = busy_after
        self._uncounted = [ipaddress.ip_network(n, strict=False) for n in uncounted]
        self._refusal_logged = -60.0
        self.most_open = 0
        self.probes_early = 0
        self.silent_closed = 0
        self.slow_closed = 0
        self.evicted = 0
        self.refused = 0
        self._listener: socket.socket | None = None
        self._accepting = False
        self._connecting = 0  # accepted, the protocol not yet told (connection_made)
        self._protocol: Callable[[bytes, Callable[[], None]], asyncio.Protocol] | None = None
        self._connects: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)
        # Connections whose head is not yet in (a reader on each), in the order they were accepted,
        # then probes and other requests in the order their heads came.
        self._heads: dict[socket.socket, _Head] = {}
        self._probes: deque[tuple[socket.socket, _Head]] = deque()
        self._ready: deque[tuple[socket.socket, _Head]] = deque()
        self._sources: dict[str, int] = {}  # connections held per source, open or waiting
        self._sweep: asyncio.TimerHandle | None = None
        self._wake: asyncio.TimerHandle | None = None  # to accept again once a head may be closed for room

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
        self._application.state.connection_bound = self
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

    def not_ready(self) -> str | None:
        """Why this server cannot take work now (every place held and a request has waited for
        one ``busy_after`` seconds), or None."""
        if not self.max_connections or self._open() < self.max_connections or not self._ready:
            return None
        if time.monotonic() - self._ready[0][1].ready_at < self.busy_after:
            return None
        return f"every one of its {self.max_connections} connections is taken and {len(self._ready)} requests wait"

    def _counted_protocol(self) -> Callable[[bytes, Callable[[], None]], asyncio.Protocol]:
        """uvicorn's protocol for a connection (as its own ``startup`` makes it), given the head
        this server read first, which lets this server accept again once the connection is closed."""
        config, state, app_state, on_close = self.config, self.server_state, self.lifespan.state, self._resume
        base: Any = config.http_protocol_class

        class Counted(base):  # type: ignore[misc]
            def __init__(self, head: bytes, leave: Callable[[], None]) -> None:
                super().__init__(config=config, server_state=state, app_state=app_state)
                self._qoss_head, self._qoss_leave = head, leave

            def connection_made(self, transport: asyncio.Transport) -> None:
                super().connection_made(transport)
                head, self._qoss_head = self._qoss_head, b""
                if head:
                    self.data_received(head)

            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                self._qoss_leave()
                on_close()

        return Counted

    def _open(self) -> int:
        return len(self.server_state.connections) + self._connecting

    def _waiting(self) -> int:
        return len(self._heads) + len(self._probes) + len(self._ready)

    def _has_space(self) -> bool:
        return self._open() + self._waiting() < self.max_connections + self.waiting_room

    def _resume(self) -> None:
        """A place or a room's space may have freed: hand over who waits, read the listening socket again."""
        while self._open() < self.max_connections and (self._probes or self._ready):
            self._hand(*(self._probes or self._ready).popleft())
        if self._accepting or self._listener is None:
            return
        loop = asyncio.get_running_loop()
        if self._has_space() or self._evictable():
            loop.add_reader(self._listener.fileno(), self._accept)
            self._accepting = True
        elif self._heads and self._wake is None:
            oldest = next(iter(self._heads.values())).accepted
            self._wake = loop.call_later(max(0.0, oldest + _EVICT_AFTER - time.monotonic()), self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._resume()

    def _evictable(self) -> bool:
        """Whether the oldest connection still sending its head may be closed to make room."""
        return bool(self._heads) and time.monotonic() - next(iter(self._heads.values())).accepted >= _EVICT_AFTER

    def _pause(self, listener: socket.socket) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            self._accepting = False

    def _source(self, address: Any) -> str | None:
        """The key a peer's connections are counted under (its address; an IPv6 /64), or None
        for an uncounted one's or when there is no limit."""
        if not self.max_connections_per_source or not isinstance(address, tuple):
            return None
        try:
            ip = ipaddress.ip_address(address[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self._uncounted):
            return None
        if isinstance(ip, ipaddress.IPv6Address):
            return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
        return str(ip)

    def _leaver(self, source: str | None) -> Callable[[], None]:
        """What a connection from ``source`` calls when it is gone (once; later calls do nothing)."""
        if source is None:
            return lambda: None
        left = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                if (n := self._sources[source] - 1) > 0:
                    self._sources[source] = n
                else:
                    del self._sources[source]
        return leave

    def _accept(self) -> None:
        """The listening socket is readable: accept while there is space (making it, if need be,
        by closing the oldest connection still sending its head), then stop reading it."""
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        for _ in range(_ACCEPTS_AT_ONCE):
            if not (self._has_space() or self._evictable()):
                break
            try:
                conn, address = listener.accept()
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
            source = self._source(address)
            if source is not None:
                if self._sources.get(source, 0) >= self.max_connections_per_source:
                    self._refuse(conn, source)
                    continue
                self._sources[source] = self._sources.get(source, 0) + 1
            if not self._has_space():
                self._evict()
            self._heads[conn] = _Head(time.monotonic(), source)
            loop.add_reader(conn.fileno(), self._read, conn)
            if self._sweep is None:
                self._sweep = loop.call_later(self._first_deadline(), self._close_late)
        if not (self._has_space() or self._evictable()):
            self._pause(listener)
            self._resume()  # to wake when a head may be closed for room

    def _refuse(self, conn: socket.socket, source: str) -> None:
        """503 to a connection beyond its source's share (what it sent already read, so that the
        close does not reset the connection before the client reads the answer)."""
        self.refused += 1
        with contextlib.suppress(OSError):
            conn.recv(_HEAD_MAX)
        _send_closing(conn, _TOO_MANY)
        if (now := time.monotonic()) - self._refusal_logged >= 60:  # once a minute at most
            self._refusal_logged = now
            log.warning("refusing connections from %s beyond max_connections_per_source=%d (%d so far); a proxy "
                        "there belongs in trusted_proxies", source, self.max_connections_per_source, self.refused)

    def _read(self, conn: socket.socket) -> None:
        """A connection still sending its head sent more (or left): once its head is in, a probe
        is handed over at once, any other request waits its turn for a place."""
        head = self._heads[conn]
        try:
            chunk = conn.recv(_HEAD_MAX + 1 - len(head.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # it left
            self._drop(conn, head)
            self._resume()
            return
        if not head.data:
            # Empty lines before a request line begin no request (httptools skips them): they
            # are not a head, and the connection is still silent until a request begins.
            chunk = chunk.lstrip(b"\r\n")
            if not chunk:
                return
        start = max(0, len(head.data) - 2)
        head.data += chunk
        end = _head_end(head.data, start)
        if end >= 0:
            self._unwatch(conn)
            head.ready_at = time.monotonic()
            # A probe is handed over at once only when it is all the connection sent: a request
            # pipelined behind it would jump the waiting room.
            if not (_is_probe(head.data) and end == len(head.data)):
                self._ready.append((conn, head))
            elif self._open() < self.max_connections + _PROBE_ROOM:
                self.probes_early += self._open() >= self.max_connections
                self._hand(conn, head)
            else:
                self._probes.append((conn, head))
        elif len(head.data) > _HEAD_MAX:
            self._drop(conn, head, _HEAD_TOO_LARGE)
        self._resume()

    def _unwatch(self, conn: socket.socket) -> None:
        asyncio.get_running_loop().remove_reader(conn.fileno())
        del self._heads[conn]

    def _drop(self, conn: socket.socket, head: _Head, answer: bytes = b"") -> None:
        """Close a connection still sending its head (after ``answer``, if any)."""
        self._unwatch(conn)
        self._leaver(head.source)()
        _send_closing(conn, answer)

    def _evict(self) -> None:
        """Close the oldest connection still sending its head, to make room for a new one."""
        conn, head = next(iter(self._heads.items()))
        self.evicted += 1
        self._drop(conn, head, _HEAD_LATE if head.data else b"")

    def _limit(self, head: _Head) -> float:
        """Seconds ``head``'s connection has from its accepting to send its whole head."""
        whole = self.header_timeout or float("inf")
        return whole if head.data else min(self.silent_timeout, whole)

    def _first_deadline(self) -> float:
        return min(self.silent_timeout, self.header_timeout or float("inf"))

    def _close_late(self) -> None:
        """Close the connections that sent nothing within ``silent_timeout``, or not their whole
        head within ``header_timeout`` (a 408 to those that began)."""
        self._sweep = None
        now, first = time.monotonic(), self._first_deadline()
        late: list[tuple[socket.socket, _Head]] = []
        then = float("inf")
        for conn, head in self._heads.items():  # in accepting order
            if head.accepted + first > now:
                then = min(then, head.accepted + first)
                break
            due = head.accepted + self._limit(head)
            if due <= now:
                late.append((conn, head))
            else:
                then = min(then, due)
        for conn, head in late:
            if head.data:
                self.slow_closed += 1  # counted before the client can see the close
            else:
                self.silent_closed += 1
            self._drop(conn, head, _HEAD_LATE if head.data else b"")
        if self._heads and then < float("inf"):
            self._sweep = asyncio.get_running_loop().call_later(then - now, self._close_late)
        self._resume()

    def _close_waiting(self) -> None:
        """Close every socket in the waiting room (the server stops)."""
        for timer in (self._sweep, self._wake):
            if timer is not None:
                timer.cancel()
        self._sweep = self._wake = None
        for conn, head in list(self._heads.items()):
            self._drop(conn, head)
        for conn, head in (*self._probes, *self._ready):
            self._leaver(head.source)()
            conn.close()
        self._probes.clear()
        self._ready.clear()

    def _hand(self, conn: socket.socket, head: _Head) -> None:
        """Give a connection whose head is in to uvicorn's protocol."""
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # as asyncio's transports do; a reset peer is found later
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # What the kernel takes of answers a client does not read is bounded (left to
                # itself it grows to megabytes): a client asking for many answers and reading none
                # makes the server work only this far ahead before its send deadline runs.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        self._connecting += 1
        self.most_open = max(self.most_open, self._open())
        task = asyncio.get_running_loop().create_task(self._connect(conn, bytes(head.data), self._leaver(head.source)))
        self._connects.add(task)
        task.add_done_callback(self._connects.discard)

    async def _connect(self, conn: socket.socket, data: bytes, leave: Callable[[], None]) -> None:
        protocol = self._protocol
        assert protocol is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol(data, leave), conn)
        except OSError:  # the client left before its transport was made
            conn.close()
            leave()
        finally:
            self._connecting -= 1
            self._resume()


def serve(application: FastAPI, *, host: str, port: int, log_level: str, backlog: int,
          max_connections: int = 0, waiting_room: bool = True, silent_timeout: float = 10.0,
          header_timeout: float = 10.0, body_timeout: float = 30.0, send_timeout: float = 10.0,
          max_connections_per_source: int = 0, trusted_proxies: Sequence[str] = ()) -> None:
    """Serve ``application`` until asked to stop (httptools; forwarded headers are qoss's own
    business), holding at most ``max_connections`` connections at once (0: as many as come)
    and, with ``waiting_room``, up to ``backlog`` more as bare sockets, probes answered at once
    and silent ones closed after ``silent_timeout`` seconds (within the process's descriptor limit).

    Every request head must arrive within ``header_timeout`` seconds and its body within
    ``body_timeout``, and a client must take some of its answer at least every ``send_timeout``
    seconds (0: no deadline); every request head is at most ``_HEAD_MAX`` bytes; with the bound,
    a client address holds at most ``max_connections_per_source`` connections (0: no limit),
    ``trusted_proxies`` and loopback addresses not counted."""
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level,
                            http=deadline_protocol(header_timeout, body_timeout, send_timeout),
                            proxy_headers=False, backlog=backlog)
    install_query_secret_filter()  # no token values in uvicorn's access log, however serve() is called
    room = min(backlog, _descriptors() - max_connections - _PROBE_ROOM - 64) if waiting_room else 0
    _Server(config, application, max_connections=max_connections, waiting_room=max(0, room),
            silent_timeout=silent_timeout, header_timeout=header_timeout,
            max_connections_per_source=max_connections_per_source,
            uncounted=[*trusted_proxies, *_LOOPBACK]).run()


def _descriptors() -> int:
    """The process's limit on open descriptors (its soft limit; a large number where there is none)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
