"""Overload: a burst gets fast answers (200, 429 or 503 with Retry-After), never a 500 or a
hang, /healthz answers throughout, and no route waits on the database on the event loop.
Real uvicorn on loopback; the limits are set low so that a few hundred requests saturate it.
The figures at scale are in benchmarks/overload.py."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import create_engine, text

from app.main import create_app
from app.settings import Settings
from app.web.deps import ReadUnitDep, in_worker_thread
from tests import REPO_ROOT
from tests.fixtures.loop_guard import no_database_on_the_loop
from tests.fixtures.served import serving

pytestmark = pytest.mark.anyio

BURST = 300
NEGOTIATION = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 4}}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_detector_sees_a_connection_taken_on_the_loop_and_not_one_taken_in_a_thread(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        with no_database_on_the_loop([engine]) as seen:
            await asyncio.to_thread(lambda: engine.connect().close())
            assert seen == []
            engine.connect().close()  # what an async route with a session does
            assert len(seen) == 1
            assert "on the event loop" in seen[0]
    finally:
        engine.dispose()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "QOSS_DATABASE_URL": f"sqlite:///{tmp_path / 'q.db'}", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning",
           "QOSS_MAX_IN_FLIGHT": "8", "QOSS_WORKER_THREADS": "4", "QOSS_DB_POOL_SIZE": "2",
           "QOSS_DB_POOL_OVERFLOW": "0", "QOSS_NEGOTIATION_BURST": "60", "QOSS_NEGOTIATION_RATE": "20"}
    log = tmp_path / "serve.log"
    with serving([sys.executable, "-m", "app.cli", "serve"], env=env, log=log, cwd=REPO_ROOT, timeout=60) as (base, _):
        yield base
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


async def test_a_burst_gets_fast_answers_never_a_500_or_a_hang(server: str) -> None:
    limits = httpx.Limits(max_connections=BURST + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server, timeout=30, limits=limits) as client:
        async def one(i: int) -> httpx.Response:
            if i % 2:
                return await client.post("/v1/negotiations", json=NEGOTIATION)
            return await client.get("/v1/rating-tables/standards-2026/revisions")

        health: list[int] = []

        async def probe() -> None:
            for _ in range(10):
                health.append((await client.get("/healthz")).status_code)
                await asyncio.sleep(0.05)

        results = await asyncio.gather(*(one(i) for i in range(BURST)), probe(), return_exceptions=True)
        answers = [r for r in results[:BURST] if isinstance(r, httpx.Response)]
        assert len(answers) == BURST, [r for r in results if isinstance(r, BaseException)][:3]
        statuses = Counter(r.status_code for r in answers)
        assert set(statuses) <= {200, 429, 503}, statuses
        assert statuses[503] > 0, statuses  # eight in flight at most: the rest are turned away at once
        assert all("retry-after" in r.headers for r in answers if r.status_code in (429, 503))
        assert {r.json()["error"] for r in answers if r.status_code == 503} <= {"Overloaded", "DatabaseUnavailable"}
        assert health
        # Ready, or not ready while every place has been taken for a second: never queued, never a 500.
        assert set(health) <= {200, 503}, health
        after = await client.post("/v1/negotiations", json={**NEGOTIATION, "peers": [
            {"name": "app", "min_levels": {"integrity": 4}}]}, headers={"Authorization": "Bearer x"})
        assert after.status_code == 401  # answering normally right after the burst
        assert (await client.get("/v1/rating-tables/esaf-2006")).status_code == 200
        assert (await client.get("/healthz")).status_code == 200  # ready again once places are free


def asgi_client(app: FastAPI, token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test", headers=headers)


Served = Callable[..., AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]]


@pytest.fixture
def app_with(settings: Settings, admin_token: str) -> Served:
    """An app with some settings changed, and an admin client for it (the loop-blocking detector on)."""

    @asynccontextmanager
    async def make(**changes: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
        app = create_app(settings.model_copy(update=changes))
        async with app.router.lifespan_context(app):
            engines = [app.state.runtime.engine, app.state.runtime.read_engine]
            with no_database_on_the_loop(engines) as blocked:
                async with asgi_client(app, admin_token) as c:
                    yield app, c
            assert not blocked, blocked[0]

    return make


async def test_the_detector_catches_a_route_that_queries_on_the_loop(settings: Settings) -> None:
    app = create_app(settings)

    async def on_the_loop(unit: ReadUnitDep) -> dict[str, int]:  # the mistake the detector is for
        return {"one": unit.session.execute(text("SELECT 1")).scalar_one()}

    def in_a_thread(unit: ReadUnitDep) -> dict[str, int]:
        return {"one": unit.session.execute(text("SELECT 1")).scalar_one()}

    app.add_api_route("/test/on-the-loop", on_the_loop)
    app.add_api_route("/test/in-a-thread", in_a_thread)
    async with app.router.lifespan_context(app):
        engines = [app.state.runtime.engine, app.state.runtime.read_engine]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test") as c:
            with no_database_on_the_loop(engines) as seen:
                assert (await c.get("/test/in-a-thread")).json() == {"one": 1}
                assert seen == []
                assert (await c.get("/test/on-the-loop")).json() == {"one": 1}
                assert len(seen) == 1
                assert "on_the_loop" in seen[0]


async def test_writers_queued_on_the_database_lock_never_starve_the_one_that_holds_it(app_with: Served) -> None:
    # More concurrent writes of one row than worker threads: the writer that holds the row
    # (SQLite: the database) still needs a thread to answer and commit. The others wait in
    # front of the door, not in every worker thread on the lock (which would stall them all
    # for SQLite's 30 s busy timeout, or for ever on a PostgreSQL row lock).
    async with app_with(worker_threads=4) as (_, c):
        async def edit(i: int) -> int:
            r = await c.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"performance": 1 + i / 10},
                              headers={"If-Match": '"1"'})
            return r.status_code

        with anyio.fail_after(20):
            codes = await asyncio.gather(*(edit(i) for i in range(12)))
        assert sorted(codes) == [200] + [409] * 11, codes


async def test_a_change_that_finds_no_write_slot_in_time_is_503_overloaded(app_with: Served) -> None:
    async with app_with(max_writes_in_flight=2, write_wait_timeout=0.2) as (app, c):
        for _ in range(2):
            await app.state.runtime.write_slots.acquire()
        try:
            r = await c.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"performance": 8},
                              headers={"If-Match": '"1"'})
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "Overloaded"
            assert r.headers["retry-after"] == "1"
        finally:
            for _ in range(2):
                app.state.runtime.write_slots.release()
        r = await c.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"performance": 8},
                          headers={"If-Match": '"1"'})
        assert r.status_code == 200, r.text


@contextmanager
def holding_every_connection(app: FastAPI) -> Iterator[None]:
    """Check out every pooled connection of the app's engines (pools of one, no overflow)."""
    engines = list({id(e): e for e in (app.state.runtime.engine, app.state.runtime.read_engine)}.values())
    held = [engine.connect() for engine in engines]
    try:
        yield
    finally:
        for conn in held:
            conn.close()


async def test_no_free_connection_within_the_pool_timeout_is_503_database_unavailable(app_with: Served) -> None:
    async with app_with(db_pool_size=1, db_pool_overflow=0, db_pool_timeout=0.2) as (app, c):
        # taken in a worker thread (the detector watches the loop's), released there too
        hold = holding_every_connection(app)
        await anyio.to_thread.run_sync(hold.__enter__)
        try:
            started = time.perf_counter()
            async with asgi_client(app) as anonymous:
                r = await anonymous.get("/v1/rating-tables/esaf-2006")
            assert time.perf_counter() - started < 5  # the pool timeout, not 30 s
            assert r.status_code == 503, r.text
            assert r.json() == {"error": "DatabaseUnavailable",
                                "detail": "the service is busy: no database connection was free"}
            assert r.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200  # its own connection
        finally:
            await anyio.to_thread.run_sync(hold.__exit__, None, None, None)
        assert (await c.get("/v1/rating-tables/esaf-2006")).status_code == 200


async def test_over_the_in_flight_limit_is_503_overloaded_and_healthz_is_never_counted(app_with: Served) -> None:
    async with app_with(max_in_flight=2, db_pool_size=1, db_pool_overflow=0, db_pool_timeout=10) as (app, c):
        hold = holding_every_connection(app)
        await anyio.to_thread.run_sync(hold.__enter__)
        anonymous = asgi_client(app)
        try:
            waiting = [asyncio.create_task(anonymous.get("/v1/rating-tables/esaf-2006")) for _ in range(2)]
            await asyncio.sleep(0.3)  # both inside, waiting for a connection
            turned_away = await anonymous.get("/v1/rating-tables/esaf-2006")
            assert turned_away.status_code == 503
            assert turned_away.json()["error"] == "Overloaded"
            assert turned_away.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200
            assert not any(t.done() for t in waiting)
        finally:
            await anyio.to_thread.run_sync(hold.__exit__, None, None, None)
        assert [(await t).status_code for t in waiting] == [200, 200]
        await anonymous.aclose()
        assert (await c.get("/v1/rating-tables/esaf-2006")).status_code == 200


@pytest.mark.parametrize("fast_paths", [True, False])
async def test_agent_messages_count_against_the_in_flight_limit_on_either_path(app_with: Served,
                                                                               fast_paths: bool) -> None:
    message = {"message": "A" * 64}  # well formed: the fast path (if on) takes it whole
    async with app_with(max_in_flight=2, db_pool_size=1, db_pool_overflow=0, db_pool_timeout=10,
                        fast_paths=fast_paths) as (app, _):
        anonymous = asgi_client(app)
        alone = await anonymous.post("/v1/agent/requests", json=message)
        assert alone.status_code != 503, alone.text  # counted once, not once per path it takes
        # Handed over to the full stack (not a message): counted once too, even at a limit of one.
        app.state.runtime.settings = app.state.runtime.settings.model_copy(update={"max_in_flight": 1})
        handed_over = await anonymous.post("/v1/agent/requests", json={"message": 5})
        assert handed_over.status_code == 422, handed_over.text
        app.state.runtime.settings = app.state.runtime.settings.model_copy(update={"max_in_flight": 2})
        hold = holding_every_connection(app)
        await anyio.to_thread.run_sync(hold.__enter__)
        try:
            waiting = [asyncio.create_task(anonymous.get("/v1/rating-tables/esaf-2006")) for _ in range(2)]
            await asyncio.sleep(0.3)  # both inside, waiting for a connection
            assert not any(t.done() for t in waiting)
            turned_away = await anonymous.post("/v1/agent/requests", json=message)
            assert turned_away.status_code == 503, turned_away.text
            assert turned_away.json()["error"] == "Overloaded"
            assert app.state.door.inside == 2
        finally:
            await anyio.to_thread.run_sync(hold.__exit__, None, None, None)
        assert [(await t).status_code for t in waiting] == [200, 200]
        assert app.state.door.inside == 0
        await anonymous.aclose()


async def test_anonymous_negotiations_are_limited_per_address_and_in_total(settings: Settings,
                                                                          admin_token: str) -> None:
    app = create_app(settings.model_copy(update={"negotiation_burst": 3, "negotiation_rate": 0.01,
                                                 "negotiation_total_burst": 5, "negotiation_total_rate": 0.01}))
    async with app.router.lifespan_context(app):
        def client(address: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 1234)),
                                     base_url="http://q.test")

        async with client("192.0.2.1") as a, client("192.0.2.2") as b:
            assert [(await a.post("/v1/negotiations", json=NEGOTIATION)).status_code for _ in range(3)] == [200] * 3
            per_address = await a.post("/v1/negotiations", json=NEGOTIATION)
            assert per_address.status_code == 429
            assert per_address.json() == {"error": "RateLimited", "detail": "rate limit exceeded for this address"}
            assert int(per_address.headers["retry-after"]) >= 1
            assert [(await b.post("/v1/negotiations", json=NEGOTIATION)).status_code for _ in range(2)] == [200] * 2
            in_total = await b.post("/v1/negotiations", json=NEGOTIATION)
            assert in_total.status_code == 429
            assert in_total.json()["detail"] == "rate limit exceeded for anonymous clients"
            token = {"Authorization": f"Bearer {admin_token}"}
            assert (await a.post("/v1/negotiations", json=NEGOTIATION, headers=token)).status_code == 200


async def test_healthz_and_livez_answer_while_every_worker_thread_is_taken(app_with: Served) -> None:
    async with app_with(worker_threads=2) as (_, c):
        limiter = anyio.to_thread.current_default_thread_limiter()
        borrowers = [object() for _ in range(int(limiter.total_tokens))]
        for borrower in borrowers:
            await limiter.acquire_on_behalf_of(borrower)
        try:
            with anyio.fail_after(5):
                assert (await c.get("/healthz")).json()["status"] == "ok"
                assert (await c.get("/livez")).status_code == 200
        finally:
            for borrower in borrowers:
                limiter.release_on_behalf_of(borrower)


async def test_blocking_calls_run_in_the_worker_threads_the_limit_counts(app_with: Served) -> None:
    async with app_with(worker_threads=2):
        limiter = anyio.to_thread.current_default_thread_limiter()

        def borrowed() -> float:
            return anyio.from_thread.run_sync(lambda: limiter.borrowed_tokens)

        assert await in_worker_thread(borrowed) == 1  # this call's own token
        assert limiter.borrowed_tokens == 0
