"""Rate limits shared by replicas on real PostgreSQL (app.adapters.db.ratelimit): a client gets
the configured burst whichever replica it reaches, not that burst once per replica."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.adapters.db.ratelimit import SharedRateLimiter, shared_buckets_engine
from app.bootstrap import prepare_database
from app.domain.ratelimit import RateLimited
from app.main import create_app
from app.settings import Settings
from tests.fixtures.db import postgres_database
from tests.fixtures.served import free_port

pytestmark = pytest.mark.postgres


def spent(limiter: SharedRateLimiter, key: str, n: int) -> list[bool]:
    out = []
    for _ in range(n):
        try:
            limiter.take(key)
        except RateLimited:
            out.append(False)
        else:
            out.append(True)
    return out


def test_two_replicas_share_one_bucket_per_key_and_limit() -> None:
    with postgres_database() as url:
        prepare_database(Settings(database_url=url))
        engines = [shared_buckets_engine(url), shared_buckets_engine(url)]
        try:
            a, b = (SharedRateLimiter(e, "tunnels", rate=0.01, burst=4) for e in engines)
            assert spent(a, "tok", 2) + spent(b, "tok", 2) == [True] * 4
            assert spent(a, "tok", 1) + spent(b, "tok", 1) == [False, False]  # each alone would allow 2 more
            with pytest.raises(RateLimited) as refused:
                b.take("tok")
            assert refused.value.retry_after >= 90  # a whole token at 0.01 per second
            assert spent(a, "other-token", 1) == [True]  # per key
            other_limit = SharedRateLimiter(engines[0], "negotiations", rate=0.01, burst=1)
            assert spent(other_limit, "tok", 1) == [True]  # and per limit
            fast = SharedRateLimiter(engines[0], "agent", rate=50, burst=1)
            assert spent(fast, "k", 2) == [True, False]
            time.sleep(0.1)  # 5 tokens' worth, capped at the burst of 1
            assert spent(fast, "k", 2) == [True, False]
        finally:
            for e in engines:
                e.dispose()


def test_full_buckets_are_removed_and_a_database_away_leaves_the_local_limit() -> None:
    with postgres_database() as url:
        prepare_database(Settings(database_url=url))
        engine = shared_buckets_engine(url)
        try:
            quick = SharedRateLimiter(engine, "agent", rate=20, burst=2, prune_every=3)
            spent(quick, "x", 1)
            time.sleep(0.2)  # full again
            spent(quick, "y", 2)  # the third spend removes the full ones
            reader = create_engine(url)
            with reader.connect() as c:
                keys = sorted(c.execute(text("SELECT key FROM rate_buckets")).scalars())
            reader.dispose()
            assert keys == ["agent:y"]
        finally:
            engine.dispose()
    away = shared_buckets_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres")
    try:
        limiter = SharedRateLimiter(away, "tunnels", rate=0.01, burst=2)
        assert spent(limiter, "tok", 3) == [True, True, False]  # the in-memory limit, nothing raised
    finally:
        away.dispose()


@pytest.mark.anyio
async def test_anonymous_negotiations_are_limited_across_two_apps_on_one_database() -> None:
    with postgres_database() as url:
        settings = Settings(database_url=url, negotiation_burst=3, negotiation_rate=0.01,
                            monitor_tunnels=False, reconcile_on_start=False)
        prepare_database(settings)
        body = {"peers": [{"name": "a", "min_levels": {"integrity": 4}}]}
        apps = [create_app(settings), create_app(settings)]
        async with apps[0].router.lifespan_context(apps[0]), apps[1].router.lifespan_context(apps[1]):
            clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("192.0.2.7", 1)),
                                         base_url="http://q.test") for app in apps]
            try:
                statuses = [(await clients[i % 2].post("/v1/negotiations", json=body)).status_code
                            for i in range(5)]
            finally:
                for c in clients:
                    await c.aclose()
    assert statuses == [200, 200, 200, 429, 429]
