"""The connection bound (app/web/server.py): a real uvicorn on loopback, accepting on its own
listening socket, holds at most ``max_connections`` connections while more clients wait in the
kernel's backlog, and answers every one of them in turn; with a waiting room it accepts more
as bare sockets, answers a probe on a new connection at once and the rest in the order they
came, closes silent ones and, when it stops, every one still waiting. It serves each connection
through uvicorn's own protocol and server state (handed over after the loop's reader on the
socket is removed), so these fail if uvicorn or uvloop changes under it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app.settings import Settings
from app.web.server import _PROBE_ROOM, _is_probe, _Server
from tests.fixtures.served import free_port
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio

BOUND, MORE = 4, 12


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Watch:
    """What the application saw: uvicorn's count of open connections at each request's start."""

    def __init__(self) -> None:
        self.server: _Server | None = None
        self.seen: list[int] = []
        self.inside = 0
        self.full = asyncio.Event()
        self.entered: list[int] = []  # /hold?i=..., in the order the requests reached the application
        self.go = 0  # /hold?i=I answers once go > I


def _application(watch: _Watch) -> FastAPI:
    app = FastAPI()

    @app.get("/held")
    async def held() -> dict[str, int]:
        assert watch.server is not None
        watch.seen.append(len(watch.server.server_state.connections))
        watch.inside += 1
        if watch.inside >= BOUND:
            watch.full.set()
        try:  # the first BOUND requests wait for each other: the bound is reached, not merely approached
            await asyncio.wait_for(watch.full.wait(), timeout=10)
        finally:
            watch.inside -= 1
        return {"seen": watch.seen[-1]}

    @app.get("/now")
    async def now() -> dict[str, bool]:
        return {"answered": True}

    @app.get("/hold")
    async def hold(i: int) -> dict[str, int]:
        watch.entered.append(i)
        for _ in range(1500):  # at most 15 s
            if watch.go > i:
                break
            await asyncio.sleep(0.01)
        return {"i": i}

    for path in ("/healthz", "/livez", "/metrics"):
        app.add_api_route(path, now, methods=["GET"])

    return app


@contextmanager
def _serving(watch: _Watch, max_connections: int, loop: str, *, waiting_room: int = 0,
             silent_timeout: float = 10.0) -> Iterator[str]:
    """``_Server`` in a thread of its own on a free loopback port; stopped (and joined, every
    held request let go) on the way out."""
    app = _application(watch)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http="httptools",
                            lifespan="off", loop=loop)
    server = watch.server = _Server(config, app, max_connections=max_connections, waiting_room=waiting_room,
                                    silent_timeout=silent_timeout)
    thread = threading.Thread(target=server.run, name="bounded-server", daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.05)
        assert server.started, "the server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        watch.go = 1_000_000
        thread.join(timeout=15)
        assert not thread.is_alive(), "the server did not stop"


async def _burst(base: str, n: int, path: str = "/held") -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        return await asyncio.gather(*(client.get(path) for _ in range(n)))


@pytest.mark.parametrize("room", [0, 64])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvicorn's "auto" is uvloop where it is installed
async def test_more_clients_than_the_bound_are_all_answered_and_never_more_are_held(loop: str, room: int) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=room) as base:
        answers = await _burst(base, BOUND + MORE)
        server = watch.server
        assert server is not None
        assert [r.status_code for r in answers] == [200] * (BOUND + MORE)
        assert max(watch.seen) == BOUND
        assert server.most_open == BOUND
        assert len(watch.seen) == BOUND + MORE


async def test_a_stopped_server_closes_its_listening_socket() -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop="asyncio") as base:
        assert [r.status_code for r in await _burst(base, BOUND + 1, "/now")] == [200] * (BOUND + 1)
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            await client.get("/held")


def test_the_bound_must_leave_room_for_the_requests_in_flight_and_the_event_streams() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        Settings(max_connections=164, max_in_flight=64, max_event_streams=100)
    assert Settings(max_connections=165, max_in_flight=64, max_event_streams=100).max_connections == 165
    assert Settings(max_connections=0).connections_held == 0


def test_by_default_the_bound_is_256_or_room_for_the_requests_in_flight_and_the_event_streams() -> None:
    assert Settings().connections_held == 256
    assert Settings(max_in_flight=250, max_event_streams=100).connections_held == 414


#: Every connection a test opened, closed after the test whatever happened in it (a socket
#: left open would be reported as a ResourceWarning in whichever test collects it).
_OPENED: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_what_the_test_opened() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _connect(base: str) -> socket.socket:
    """A new connection to ``base`` (closed after the test at the latest)."""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=15)
    _OPENED.append(conn)
    return conn


def _send(base: str, path: str) -> socket.socket:
    """A new connection to ``base`` with ``GET path`` sent on it (Connection: close)."""
    host = base.removeprefix("http://").split(":")[0]
    conn = _connect(base)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    return conn


def _status(conn: socket.socket) -> int:
    """The status of the answer on ``conn``, read to its end (15 s at most); the connection closed."""
    with conn:
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closed ``conn`` without answering (15 s at most)."""
    with conn:
        conn.settimeout(15)
        try:
            return conn.recv(1) == b""
        except ConnectionResetError:  # closed with the request unread
            return True


def _hold_every_place(base: str, watch: _Watch) -> list[socket.socket]:
    """BOUND requests to /hold, each inside the application before the next is sent."""
    held = []
    for i in range(BOUND):
        held.append(_send(base, f"/hold?i={i}"))
        assert until(lambda: len(watch.entered) == i + 1)  # noqa: B023 - asked before i changes
    return held


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_probe_on_a_new_connection_is_answered_while_every_place_is_held_and_requests_wait(loop: str) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=64) as base:
        server = watch.server
        assert server is not None
        held = _hold_every_place(base, watch)
        waiting = []
        for i in range(BOUND, BOUND + MORE):
            waiting.append(_send(base, f"/hold?i={i}"))
            assert until(lambda: len(server._ready) == i - BOUND + 1)  # noqa: B023
        for path in ("/healthz", "/livez", "/metrics", "/healthz?verbose=1"):
            assert _status(_send(base, path)) == 200
        assert server.probes_early == 4
        assert watch.entered == list(range(BOUND))
        assert len(server._ready) == MORE
        watch.go = BOUND + MORE
        assert [_status(c) for c in held + waiting] == [200] * (BOUND + MORE)
        assert watch.entered == list(range(BOUND + MORE))
        assert server.most_open <= BOUND + _PROBE_ROOM


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_probe_with_a_request_pipelined_behind_it_waits_its_turn(loop: str) -> None:
    """Only a probe alone on its connection is handed over beyond the bound: the request behind
    it would otherwise be served before the ones waiting."""
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=64) as base:
        server = watch.server
        assert server is not None
        held = _hold_every_place(base, watch)
        host = base.removeprefix("http://").split(":")[0]
        jumper = _connect(base)
        jumper.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n"
                       f"GET /hold?i={BOUND} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        assert until(lambda: len(server._ready) == 1)  # waiting with the others, not handed over
        assert server.probes_early == 0
        assert watch.entered == list(range(BOUND))
        watch.go = BOUND + 1
        assert [_status(c) for c in held] == [200] * BOUND
        answers = b""
        with jumper:
            while chunk := jumper.recv(65536):
                answers += chunk
        assert answers.count(b"HTTP/1.1 200 ") == 2  # both answered, in turn
        assert watch.entered == list(range(BOUND + 1))


@pytest.mark.parametrize("room", [0, 2, 64])  # none; fuller than the room (the rest in the backlog); room for all
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_requests_beyond_the_bound_are_answered_in_the_order_they_came(loop: str, room: int) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=room) as base:
        server = watch.server
        assert server is not None
        conns = _hold_every_place(base, watch)
        for i in range(BOUND, BOUND + MORE):
            conns.append(_send(base, f"/hold?i={i}"))
            in_room = min(i - BOUND + 1, room)
            assert until(lambda: len(server._ready) == in_room)  # noqa: B023
        assert watch.entered == list(range(BOUND))
        for i, conn in enumerate(conns):  # one place frees at a time
            watch.go = i + 1
            assert _status(conn) == 200
        assert watch.entered == list(range(BOUND + MORE))
        assert server.most_open == BOUND
        assert server.probes_early == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_silent_connection_in_the_waiting_room_is_closed_and_one_that_asked_waits_its_turn(loop: str) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=64, silent_timeout=0.2) as base:
        server = watch.server
        assert server is not None
        held = _hold_every_place(base, watch)
        asked = _send(base, f"/hold?i={BOUND}")
        assert until(lambda: len(server._ready) == 1)
        silent = _connect(base)
        assert _closed_by_server(silent)
        assert server.silent_closed == 1
        assert len(server._ready) == 1
        watch.go = BOUND + 1
        assert [_status(c) for c in [*held, asked]] == [200] * (BOUND + 1)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_stopping_server_closes_every_connection_in_its_waiting_room(loop: str) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop, waiting_room=64) as base:
        server = watch.server
        assert server is not None
        held = _hold_every_place(base, watch)
        asked = _send(base, f"/hold?i={BOUND}")
        silent = _connect(base)
        assert until(lambda: len(server._ready) == 1 and len(server._heads) == 1)
        server.should_exit = True
        assert until(lambda: server._waiting() == 0)
        assert _closed_by_server(asked)
        assert _closed_by_server(silent)
        watch.go = BOUND
        assert [_status(c) for c in held] == [200] * BOUND
        assert watch.entered == list(range(BOUND))


@pytest.mark.parametrize(("head", "probe"), [
    (b"GET /healthz HTTP/1.1\r\n", True), (b"GET /livez HTTP/1.0\r\n", True), (b"GET /metrics?x=1 HTTP", True),
    (b"GET /healthzz HTTP/1.1", False), (b"POST /healthz HTTP/1.1", False), (b"GET /v1/negotiations", False),
    (b"GET /healthz", False), (b"GET /he", False), (b"", False)])
def test_only_a_probes_request_line_is_a_probe(head: bytes, probe: bool) -> None:
    assert _is_probe(head) is probe


def test_the_waiting_room_is_on_by_default_and_can_be_turned_off() -> None:
    assert Settings().waiting_room is True
    assert Settings(waiting_room=False).waiting_room is False
