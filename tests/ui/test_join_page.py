"""The invitation's page (``/ui/join``): public and static (the same for every invitation: the secret
is in the link's fragment, which never reaches the server), Host's public keys only, the console's
security headers and no referrer, its scripts this server's own; no page where this server is not
Host. What the page does in a phone's browser: ``tests/ui/browser/test_phone_join.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.domain.agent import b64e
from app.main import create_app
from app.settings import Settings
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config
from tests.ui.conftest import client_of

pytestmark = pytest.mark.anyio


@pytest.fixture
async def host_app(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    config, keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app):
        yield app, keys


async def test_the_join_page_is_static_and_carries_public_keys_only(host_app: tuple[Any, Any]) -> None:
    app, keys = host_app
    async with client_of(app) as client:
        page = await client.get("/ui/join")
        other = await client.get("/ui/join", params={"i": "x" * 43})
    assert page.status_code == 200
    assert page.text == other.text  # nothing of a request shapes it
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert f'data-host="{SERVER_ID}"' in page.text
    assert f'data-host-kem="{b64e(keys.public.kem)}"' in page.text
    assert f'data-sign-key="{b64e(keys.public.sign)}"' in page.text
    assert re.findall(r'<script src="([^"]+)"', page.text) == [
        "/ui/static/qoss-vendor.min.js", "/ui/static/agent-client.js", "/ui/static/phone-keys.js",
        "/ui/static/join.js"]
    assert re.findall(r'name="platform" value="([a-z]+)"', page.text) == ["android", "apple", "windows",
                                                                           "networkmanager"]
    assert "Sign out" not in page.text
    for pem in keys.private_pem():
        assert b"".join(pem.splitlines()[1:-1]).decode() not in page.text


async def test_a_server_that_is_not_host_has_no_join_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/join")
    assert page.status_code == 404
    assert "there are no invitations here" in page.text
