"""The HTTP server ``qoss serve`` runs: uvicorn's, told first when it is asked to stop, and
holding at most ``max_connections`` connections at once.

**The connection bound.** Left to itself the event loop accepts every connection the kernel
has queued, so a burst of 3,000 clients becomes 3,000 transports, parsers, scopes and tasks
alive at once, most of them only to be answered 503 by admission control; the memory they take
at their peak is what the process keeps afterwards (docs/performance.md, "Under a burst").
With a bound, :class:`_Server` accepts on its own listening socket (``loop.add_reader`` and
``loop.connect_accepted_socket``, both public) while fewer than ``max_connections`` are open,
stops reading the socket at the bound and starts again as soon as one closes: the rest wait
in the kernel's listen backlog (``listen_backlog``) and are answered in turn, a new health
check's connection among them (one kept open is answered at once). uvicorn then serves each
accepted connection as it does its own; what of it this relies on beyond its documented API
(``Server.startup(sockets=[])`` listening on nothing, ``Config.http_protocol_class`` and its
keyword arguments, ``server_state.connections``, ``lifespan.state``) is exercised by
``tests/api/test_connection_bound.py``, on asyncio and uvloop, so an upgrade that changes it
fails there. ``max_connections=0`` is uvicorn's own accepting, untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

__all__ = ["serve"]

log = logging.getLogger("uvicorn.error")

#: Seconds before accepting again after the process ran out of descriptors or memory (asyncio's own).
_ACCEPT_RETRY = 1.0


class _Server(uvicorn.Server):
    """On SIGTERM or SIGINT the application is told it is draining before uvicorn stops taking
    requests: open event streams end then (their clients resume elsewhere with Last-Event-ID),
    so the shutdown waits only for the requests in progress, not for every follower to leave.

    With ``max_connections`` above 0 it holds at most that many connections open at once (see
    the module's docstring); ``most_open`` is the highest number it held.
    """

    def __init__(self, config: uvicorn.Config, application: FastAPI, *, max_connections: int = 0) -> None:
        super().__init__(config)
        self._application = application
        self.max_connections = max_connections
        self.most_open = 0
        self._listener: socket.socket | None = None
        self._accepting = False
        self._connecting = 0  # accepted, the protocol not yet told (connection_made)
        self._protocol: Callable[[], asyncio.Protocol] | None = None
        self._connects: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)

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
        log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit); at most %d connections at once",
                 *listener.getsockname()[:2], self.max_connections)
        self._resume()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            self._pause(listener)
            listener.close()
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

    def _resume(self) -> None:
        if not self._accepting and self._listener is not None and self._open() < self.max_connections:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)
            self._accepting = True

    def _pause(self, listener: socket.socket) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            self._accepting = False

    def _accept(self) -> None:
        """The listening socket is readable: accept up to the bound, then stop reading it."""
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        while self._open() < self.max_connections:
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
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):  # as asyncio's transports do; a reset peer is found later
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connecting += 1
            self.most_open = max(self.most_open, self._open())
            task = loop.create_task(self._connect(conn))
            self._connects.add(task)
            task.add_done_callback(self._connects.discard)
        self._pause(listener)

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
          max_connections: int = 0) -> None:
    """Serve ``application`` until asked to stop (httptools; forwarded headers are qoss's own
    business), holding at most ``max_connections`` connections at once (0: as many as come)."""
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level, http="httptools",
                            proxy_headers=False, backlog=backlog)
    _Server(config, application, max_connections=max_connections).run()
