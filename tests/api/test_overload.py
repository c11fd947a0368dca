"""Overload: a burst gets fast answers (200, 429 or 503 with Retry-After), never a 500 or a
hang, /healthz answers throughout, and no route waits on the database on the event loop.
Real uvicorn on loopback; the limits are set low so that a few hundred requests saturate it.
The figures at scale are in benchmarks/overload.py."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine

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
        assert set(health) == {200}
        after = await client.post("/v1/negotiations", json={**NEGOTIATION, "peers": [
            {"name": "app", "min_levels": {"integrity": 4}}]}, headers={"Authorization": "Bearer x"})
        assert after.status_code == 401  # answering normally right after the burst
        assert (await client.get("/v1/rating-tables/esaf-2006")).status_code == 200
