"""An app per test over a freshly migrated database with the shipped data loaded."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.bootstrap import prepare_database
from app.main import create_app
from app.services.auth import create_token
from app.settings import Settings
from tests.fixtures.loop_guard import no_database_on_the_loop
from tests.fixtures.secrets import register


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(database_url: str) -> Settings:
    settings = Settings(database_url=database_url, max_body_bytes=65536)
    prepare_database(settings)  # the product's own bootstrap: migrations + shipped tables and policies
    return settings


@pytest.fixture
def admin_token(settings: Settings) -> str:
    return make_token(settings.database_url, "test-admin", ["admin"])


def make_token(database_url: str, name: str, scopes: list[str], expires_in: int | None = None) -> str:
    engine = make_engine(database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            token, _ = create_token(uow=uow, name=name, scopes=scopes, expires_in=expires_in, created_by="tests")
            uow.commit()
    finally:
        engine.dispose()
    register(token)
    return token


@pytest.fixture
async def client(settings: Settings, admin_token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose requests carry an admin token (auth itself is tested in test_auth.py)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {admin_token}"}
        # Every API test also checks that no route waits on the database on the event loop.
        with no_database_on_the_loop([app.state.runtime.engine, app.state.runtime.read_engine]) as blocked:
            async with httpx.AsyncClient(transport=transport, base_url="http://qoss.test", headers=headers) as c:
                yield c
        assert not blocked, blocked[0]
