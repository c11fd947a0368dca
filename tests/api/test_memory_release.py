"""The service gives memory back once quiet (app.adapters.memory): counted requests start the
clock, /healthz does not, and the setting turns it off."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.main import create_app
from app.settings import Settings

pytestmark = pytest.mark.anyio


async def test_a_quiet_second_after_a_request_replaces_the_pools(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"memory_release_after": 1.0}))
    async with app.router.lifespan_context(app):
        release = app.state.runtime.memory_release
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://qoss.test") as c:
            assert (await c.get("/healthz")).status_code == 200
            await asyncio.sleep(1.3)
            assert release.releases == 0  # health probes never count as work
            assert (await c.get("/v1/algorithms")).status_code == 200
            engines = {app.state.runtime.engine, app.state.runtime.read_engine}
            pools = {engine.pool for engine in engines}
            await asyncio.sleep(1.6)
            assert release.releases == 1
            # Each pool replaced: the connections it kept are closed (the leader's next look opens one).
            assert not pools & {engine.pool for engine in engines}
            assert (await c.get("/v1/algorithms")).status_code == 200  # a new pool opens connections again


async def test_memory_release_off_starts_nothing(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"memory_release": []}))
    async with app.router.lifespan_context(app):
        assert app.state.runtime.memory_release is None
