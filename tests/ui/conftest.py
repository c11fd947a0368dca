"""The console over an app per test (a freshly migrated database with the shipped data), as a
browser would use it: cookies kept, forms posted, htmx's headers sent where htmx would."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.adapters.agent.crypto import KeyPair
from app.bootstrap import prepare_database
from app.domain.agent import b64e
from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config
from tests.fixtures.loop_guard import no_database_on_the_loop
from tests.fixtures.secrets import register
from tests.unit.services.test_tunnels_service import up_on_initiate

__all__ = ["HTMX", "Site", "assert_users_page", "client_of", "csrf_of", "gateway_app", "gateway_site", "rows",
           "sign_in"]

HTMX = {"HX-Request": "true"}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(database_url: str, tmp_path: Path, own_state_dir: Path) -> Settings:
    settings = Settings(database_url=database_url, max_body_bytes=262144, trusted_proxies=["127.0.0.1"],
                        measurements_dir=tmp_path / "bench", state_dir=own_state_dir)
    prepare_database(settings)
    return settings


@pytest.fixture
def token(settings: Settings) -> Callable[..., str]:
    """Make a token on this test's database: ``token("name", ["scope", ...])``."""

    def make(name: str = "editor", scopes: list[str] | None = None, expires_in: int | None = None) -> str:
        return make_token(settings.database_url, name, scopes or ["ratings:write"], expires_in)

    return make


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[Any]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def host_app(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, KeyPair]]:
    """An app that plays the agent's Host (and Target, in one process): the app and Host's keys."""
    config, keys = agent_server_config(tmp_path)
    application = create_app(settings.model_copy(update={"agent_config": config}))
    async with application.router.lifespan_context(application):
        yield application, keys


def assert_users_page(page: httpx.Response, keys: KeyPair) -> None:
    """``page`` is a page of Host's for a user: served without a console session, under the
    console's CSP (scripts and requests to this server alone), never cached, with Host's public
    keys and none of its private ones."""
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    assert page.headers["cache-control"] == "no-store"
    assert f'data-host="{SERVER_ID}"' in page.text
    assert f'data-host-kem="{b64e(keys.public.kem)}"' in page.text
    assert "Sign out" not in page.text  # no console session here
    for name, pem in zip(("sign", "kem"), keys.private_pem(), strict=True):
        assert b"".join(pem.splitlines()[1:-1]).decode() not in page.text, name


@pytest.fixture
async def browser(app: Any) -> AsyncIterator[Callable[[], httpx.AsyncClient]]:
    """Clients on the app, each its own cookie jar (a browser); no route waits on the database
    on the event loop."""
    clients: list[httpx.AsyncClient] = []

    def new() -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://qoss.test")
        clients.append(client)
        return client

    with no_database_on_the_loop([app.state.runtime.engine, app.state.runtime.read_engine]) as blocked:
        yield new
        for c in clients:
            await c.aclose()
    assert not blocked, blocked[0]


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str) -> str:
    """Sign ``client`` in with ``token``; returns the session's CSRF token."""
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", data={"csrf": csrf_of(form.text), "token": token})
    assert answer.status_code == 303, answer.text
    register(client.cookies["qoss_session"])  # the secret sweep: never in a database or a log
    page = await client.get("/ui/tables")
    assert page.status_code == 200
    return csrf_of(page.text)


def client_of(app: Any) -> httpx.AsyncClient:
    """A client on ``app`` with no session yet (a browser of its own)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://qoss.test")


@dataclass
class Site:
    """An app with one gateway: the app, an admin's API client on it, the gateway's fake charon
    and the app's settings."""

    app: Any
    api: httpx.AsyncClient
    charon: FakeCharon
    settings: Settings


@asynccontextmanager
async def gateway_site(settings: Settings, tmp_path: Path, *, up: bool = True, **updates: Any) -> AsyncIterator[Site]:
    """An app (``settings`` with ``updates``, no tunnel monitor) with one gateway, ``left``, on a
    fake charon (``up``: that brings every conn up)."""
    with FakeCharon(tmp_path / "left.vici") as fake:
        if up:
            up_on_initiate(fake)
        changed = settings.model_copy(update={"vici_socket_dirs": [tmp_path], "monitor_tunnels": False, **updates})
        app = create_app(changed)
        admin = make_token(settings.database_url, "admin", ["admin"])
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
                headers={"Authorization": f"Bearer {admin}"}) as api:
            r = await api.post("/v1/gateways", json={"name": "left", "vici_socket": str(fake.socket_path),
                                                     "ike_address": "10.99.0.1", "inside_networks": ["10.1.0.0/24"]})
            assert r.status_code == 201, r.text
            yield Site(app, api, fake, changed)


@asynccontextmanager
async def gateway_app(settings: Settings, tmp_path: Path,
                      **updates: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """:func:`gateway_site` whose charon brings every conn up: the app and an admin's API client on it."""
    async with gateway_site(settings, tmp_path, **updates) as site:
        yield site.app, site.api


def rows(settings: Settings, query: str, **params: Any) -> list[tuple[Any, ...]]:
    """The rows ``query`` (with ``params``) reads from the database of ``settings``."""
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query), params)]
    finally:
        engine.dispose()
