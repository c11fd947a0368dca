"""Slow clients (app/web/server.py) against a real uvicorn on loopback: a connection holds a place
only once its request head is in, a head or a body that does not arrive in time ends the
connection (408), one client address holds at most its share of connections, and /healthz says
"not ready" while every place is held and requests wait. The last test pins the shape of
uvicorn's httptools protocol that the deadlines inside it rely on."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from app.api.routes.health import router as health_router
from app.settings import Settings
from app.web.server import _EVICT_AFTER, _HEAD_MAX, _Server, deadline_protocol
from tests.fixtures.library_pins import assert_pinned
from tests.fixtures.served import free_port
from tests.fixtures.waiting import until

BOUND = 4
LOOPS = ["asyncio", "uvloop"]  # uvicorn's "auto" is uvloop where it is installed


class _Probe:
    async def database_answers(self) -> bool:
        return True


class _Gate:
    """Requests to /hold wait inside the application until ``open`` (15 s at most)."""

    def __init__(self) -> None:
        self.inside = 0
        self.open = False


def _application(gate: _Gate) -> FastAPI:
    app = FastAPI()
    app.include_router(health_router)  # the real /healthz and /livez
    app.state.runtime = SimpleNamespace(health=_Probe(), leadership=None)  # what /healthz reads of the runtime

    @app.get("/now")
    async def now() -> dict[str, bool]:
        return {"answered": True}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"length": len(await request.body())}

    @app.get("/hold")
    async def hold() -> dict[str, bool]:
        gate.inside += 1
        for _ in range(1500):
            if gate.open:
                break
            await asyncio.sleep(0.01)
        return {"held": True}

    return app


@contextmanager
def _serving(loop: str = "asyncio", *, max_connections: int = 256, waiting_room: int = 512,
             header_timeout: float = 10.0, body_timeout: float = 30.0,
             **server: Any) -> Iterator[tuple[str, _Server, _Gate]]:
    """``_Server`` with the deadlines in a thread of its own on a free loopback port; stopped
    (and joined, every held request let go) on the way out."""
    gate = _Gate()
    app = _application(gate)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop=loop,
                            http=deadline_protocol(header_timeout, body_timeout))
    bounded = _Server(config, app, max_connections=max_connections, waiting_room=waiting_room,
                      header_timeout=header_timeout, **server)
    thread = threading.Thread(target=bounded.run, name="slow-clients-server", daemon=True)
    thread.start()
    try:
        assert until(lambda: bounded.started or not thread.is_alive()), "the server did not start"
        assert bounded.started, "the server did not start"
        yield f"http://127.0.0.1:{port}", bounded, gate
    finally:
        bounded.should_exit = True
        gate.open = True
        thread.join(timeout=15)
        assert not thread.is_alive(), "the server did not stop"


#: Every socket a test opened, closed after the test whatever happened in it.
_OPENED: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_what_the_test_opened() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _connect(base: str, source: str = "127.0.0.1") -> socket.socket:
    """A new connection to ``base`` from the loopback address ``source``."""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=15, source_address=(source, 0))
    _OPENED.append(conn)
    return conn


def _answer(conn: socket.socket, seconds: float = 15) -> bytes:
    """What the server sent on ``conn`` until it closed it (``seconds`` at most)."""
    conn.settimeout(seconds)
    answer = b""
    try:
        while chunk := conn.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _drip_until_closed(conn: socket.socket, every: float, seconds: float) -> tuple[bytes, float]:
    """Send one header line on ``conn`` every ``every`` seconds until the server answers or closes
    it (``seconds`` at most): what it sent and after how long."""
    started = time.monotonic()
    conn.settimeout(every)
    for i in range(int(seconds / every) + 1):
        try:
            conn.sendall(f"X-Drip-{i}: {i}\r\n".encode())
            data = conn.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return b"", time.monotonic() - started
        return data + (_answer(conn) if data else b""), time.monotonic() - started
    return b"", float("inf")


@pytest.mark.parametrize("loop", LOOPS)
def test_260_drip_fed_connections_do_not_keep_a_request_waiting(loop: str) -> None:
    with _serving(loop) as (base, server, _):
        drips = []
        try:
            for _ in range(260):
                conn = _connect(base)
                conn.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\n")  # and no end of head: a drip
                drips.append(conn)
            assert until(lambda: len(server._heads) == 260)
            with httpx.Client(base_url=base, timeout=10) as client:  # the client's timeout of the finding
                answer = client.get("/now")
            assert answer.status_code == 200
            assert answer.json() == {"answered": True}
            assert server.most_open <= 2  # no drip was handed a place
        finally:
            for conn in drips:
                conn.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_drip_fed_head_is_closed_with_408_after_the_header_timeout(loop: str) -> None:
    with _serving(loop, header_timeout=1.0) as (base, server, _):
        conn = _connect(base)
        conn.sendall(b"GET /now HTTP/1.1\r\n")
        answer, after = _drip_until_closed(conn, every=0.3, seconds=10)
        assert _status(answer) == 408, answer
        assert b'"error": "RequestTimeout"' in answer
        assert after < 10
        assert server.slow_closed == 1
        assert server.most_open == 0


@pytest.mark.parametrize("loop", LOOPS)
def test_a_drip_fed_second_request_on_a_kept_alive_connection_is_closed_after_the_header_timeout(loop: str) -> None:
    with _serving(loop, header_timeout=1.0) as (base, _, _):
        conn = _connect(base)
        conn.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\n\r\n")
        conn.settimeout(15)
        first = b""
        while not first.endswith(b'{"answered":true}'):
            chunk = conn.recv(65536)
            assert chunk, first
            first += chunk
        conn.sendall(b"GET /now HTTP/1.1\r\n")  # kept alive: the next request's head, a line at a time
        answer, after = _drip_until_closed(conn, every=0.3, seconds=10)
        assert _status(answer) == 408, answer
        assert after < 10


@pytest.mark.parametrize("loop", LOOPS)
def test_a_body_that_does_not_arrive_within_the_body_timeout_is_408(loop: str) -> None:
    with _serving(loop, body_timeout=1.0) as (base, _, _):
        conn = _connect(base)
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: qoss\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: 100\r\n\r\n" + b"x" * 10)
        started = time.monotonic()
        answer = _answer(conn)
        assert _status(answer) == 408, answer
        assert b'"detail": "the request body did not arrive in time"' in answer
        assert time.monotonic() - started < 10


@pytest.mark.parametrize("loop", LOOPS)
def test_a_slow_body_that_arrives_within_the_body_timeout_is_answered(loop: str) -> None:
    with _serving(loop, body_timeout=5.0) as (base, _, _):
        conn = _connect(base)
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\nContent-Length: 30\r\n\r\n")
        for _ in range(3):
            time.sleep(0.2)
            conn.sendall(b"x" * 10)
        answer = _answer(conn)
        assert _status(answer) == 200, answer
        assert answer.endswith(b'{"length":30}')


@pytest.mark.parametrize("loop", LOOPS)
def test_connections_beyond_the_per_source_limit_are_503_and_other_sources_are_served(loop: str) -> None:
    with _serving(loop, max_connections_per_source=3, uncounted=["127.0.0.3/32"]) as (base, server, _):
        kept = _connect(base)  # one open in uvicorn (kept alive), two still sending their heads
        kept.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\n\r\n")
        kept.settimeout(15)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        for _ in range(2):
            _connect(base).sendall(b"GET /now HTTP/1.1\r\n")
        assert until(lambda: len(server._heads) == 2)
        refused = _answer(_connect(base))
        assert _status(refused) == 503, refused
        assert b"retry-after: 1" in refused
        assert b'"error": "Overloaded"' in refused
        assert server.refused == 1
        with httpx.Client(base_url=base, timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
            assert other.get("/now").status_code == 200
        proxied = [_connect(base, "127.0.0.3") for _ in range(5)]  # an uncounted network's (a trusted proxy's)
        for conn in proxied:
            conn.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\n\r\n")
        assert [_status(_answer(conn)) for conn in proxied] == [200] * 5
        kept.close()  # its place is given back: the address may connect again
        assert until(lambda: server._sources.get("127.0.0.1") == 2)
        again = _connect(base)
        again.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\n\r\n")
        assert _status(_answer(again)) == 200
        assert server.refused == 1


@pytest.mark.parametrize("loop", LOOPS)
def test_healthz_is_503_while_every_place_is_held_and_requests_wait_and_livez_stays_200(loop: str) -> None:
    with _serving(loop, max_connections=BOUND, waiting_room=64, busy_after=0.0) as (base, server, gate):
        with httpx.Client(base_url=base, timeout=10) as probe:
            assert probe.get("/healthz").status_code == 200
        held = []
        for i in range(BOUND + 1):  # every place, and one request waiting for a place
            conn = _connect(base)
            conn.sendall(b"GET /hold HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\n\r\n")
            held.append(conn)
            if i < BOUND:
                assert until(lambda: gate.inside == i + 1)  # noqa: B023 - asked before i changes
        assert until(lambda: len(server._ready) == 1)
        with httpx.Client(base_url=base, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as probe:
            busy = probe.get("/healthz")
            assert busy.status_code == 503
            assert busy.json()["error"] == "Overloaded"
            assert busy.headers["retry-after"] == "1"
            assert probe.get("/livez").status_code == 200
            gate.open = True
            assert [_status(_answer(conn)) for conn in held] == [200] * (BOUND + 1)
            assert probe.get("/healthz").status_code == 200


@pytest.mark.parametrize("loop", LOOPS)
def test_when_every_socket_is_taken_the_oldest_unfinished_head_makes_room(loop: str) -> None:
    with _serving(loop, max_connections=2, waiting_room=2, silent_timeout=60, header_timeout=60) as (base, server, _):
        drips = []
        for _ in range(4):
            conn = _connect(base)
            conn.sendall(b"GET /now HTTP/1.1\r\n")
            drips.append(conn)
        assert until(lambda: len(server._heads) == 4)
        time.sleep(_EVICT_AFTER)
        late = _connect(base)
        late.sendall(b"GET /now HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\n\r\n")
        assert _status(_answer(late)) == 200
        assert server.evicted == 1
        assert _status(_answer(drips[0])) == 408


def test_a_head_over_the_limit_is_431() -> None:
    with _serving() as (base, _, _):
        conn = _connect(base)
        conn.sendall(b"GET /now HTTP/1.1\r\nX-Big: " + b"a" * _HEAD_MAX)
        assert _status(_answer(conn)) == 431


def test_uvicorns_httptools_protocol_has_the_shape_the_deadlines_rely_on() -> None:
    """``deadline_protocol`` overrides httptools' parser callbacks on uvicorn's protocol and reads
    its ``cycle``: the protocol must be its parser's callback object and the cycle must say
    whether the response started and ended."""
    assert_pinned("uvicorn", "app/web/deadlines.py deadline_protocol")
    assert_pinned("httptools", "app/web/deadlines.py deadline_protocol")
    for name in ("on_message_begin", "on_headers_complete", "on_message_complete", "data_received",
                 "pause_writing", "resume_writing"):
        assert callable(getattr(HttpToolsProtocol, name)), name
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:  # reads the body to its end, or the client's leaving
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            sent.append(message)
        sent.append(message)

    class _Transport(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.written = b""
            self.closed = False
            self.protocol: asyncio.BaseProtocol | None = None

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

        def write(self, data: bytes | bytearray | memoryview) -> None:
            self.written += bytes(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

        def is_reading(self) -> bool:
            return True

        def get_protocol(self) -> asyncio.BaseProtocol:
            assert self.protocol is not None
            return self.protocol

    async def drive() -> None:
        config = uvicorn.Config(app, http=deadline_protocol(0.2, 0.2), log_level="warning")
        config.load()
        protocol: Any = config.http_protocol_class(config=config, server_state=ServerState(),  # type: ignore[call-arg]
                                                   app_state={})
        transport = _Transport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: q\r\n")  # half a head: a timer
        assert protocol._qoss_timer is not None
        protocol.data_received(b"Content-Length: 4\r\n\r\nab")  # half a body: the body's timer
        assert isinstance(protocol.cycle, RequestResponseCycle)
        assert protocol.cycle.response_started is False
        assert protocol.cycle.response_complete is False
        await asyncio.sleep(0.5)
        assert transport.written.startswith(b"HTTP/1.1 408 ")
        assert transport.closed
        protocol.connection_lost(None)  # the transport's answer to its closing
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(drive())
    assert [m["type"] for m in sent] == ["http.request", "http.disconnect"]  # the application is told the client left


def test_the_deadlines_and_the_share_per_source_are_on_by_default_and_0_turns_them_off() -> None:
    settings = Settings()
    assert (settings.header_timeout, settings.body_timeout, settings.max_connections_per_source) == (10.0, 30.0, 64)
    assert settings.send_timeout == 10.0
    off = Settings(header_timeout=0, body_timeout=0, send_timeout=0, max_connections_per_source=0)
    # uvicorn's protocol as it is only with no deadline and no limit on later heads either
    assert deadline_protocol(off.header_timeout, off.body_timeout, off.send_timeout, head_max=0) is HttpToolsProtocol
    assert deadline_protocol(off.header_timeout, off.body_timeout, off.send_timeout) is not HttpToolsProtocol
    assert deadline_protocol(settings.header_timeout, settings.body_timeout) is not HttpToolsProtocol
