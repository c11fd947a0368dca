"""The connection bound (app/api/server.py): a real uvicorn on loopback, accepting on its own
listening socket, holds at most ``max_connections`` connections while more clients wait in the
kernel's backlog, and answers every one of them in turn. It serves each connection through
uvicorn's own protocol and server state, so these fail if uvicorn changes under it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app.api.server import _Server
from app.settings import Settings
from tests.fixtures.served import free_port

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

    return app


@contextmanager
def _serving(watch: _Watch, max_connections: int, loop: str) -> Iterator[str]:
    """``_Server`` in a thread of its own on a free loopback port; stopped (and joined) on the way out."""
    app = _application(watch)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http="httptools",
                            lifespan="off", loop=loop)
    server = watch.server = _Server(config, app, max_connections=max_connections)
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
        thread.join(timeout=15)
        assert not thread.is_alive(), "the server did not stop"


async def _burst(base: str, n: int, path: str = "/held") -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        return await asyncio.gather(*(client.get(path) for _ in range(n)))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvicorn's "auto" is uvloop where it is installed
async def test_more_clients_than_the_bound_are_all_answered_and_never_more_are_held(loop: str) -> None:
    watch = _Watch()
    with _serving(watch, max_connections=BOUND, loop=loop) as base:
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
