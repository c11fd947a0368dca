"""The user's own devices page (``/ui/my-devices``): served by Host without a console sign-in,
with Host's public keys only and the console's security headers, scripts from this server alone;
no page where this server is not Host. What the page does in a browser:
``tests/ui/browser/test_my_devices.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.domain.agent import b64e
from app.domain.agent.platforms import LABELS
from app.main import create_app
from app.settings import Settings
from tests import REPO_ROOT
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config
from tests.ui.conftest import client_of

pytestmark = pytest.mark.anyio


@pytest.fixture
async def host_app(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    config, keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app):
        yield app, keys


async def test_host_serves_the_page_with_public_keys_only_and_no_sign_in(host_app: tuple[Any, Any]) -> None:
    app, keys = host_app
    async with client_of(app) as client:
        page = await client.get("/ui/my-devices")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    assert page.headers["cache-control"] == "no-store"
    assert f'data-host="{SERVER_ID}"' in page.text
    assert f'data-host-kem="{b64e(keys.public.kem)}"' in page.text
    assert f'data-target="{SERVER_ID}" data-sign-key="{b64e(keys.public.sign)}"' in page.text
    for name, label in LABELS.items():
        assert f'<li data-platform="{name}">{label}</li>' in page.text
    assert "Sign out" not in page.text
    assert "ask your administrator for a new invitation" in page.text
    # Every script and link is this server's own.
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert src.startswith(("/ui/static/", "data:")), src
    for name, pem in zip(("sign", "kem"), keys.private_pem(), strict=True):
        assert b"".join(pem.splitlines()[1:-1]).decode() not in page.text, name


async def test_a_server_that_is_not_host_has_no_devices_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/my-devices")
    assert page.status_code == 404


def test_the_pages_script_asks_nothing_of_any_other_host_and_times_every_request() -> None:
    script = (REPO_ROOT / "app" / "ui" / "static" / "my-devices.js").read_text()
    assert "http://" not in script and "https://" not in script  # noqa: PT018
    assert script.count("fetch(") == 1  # one place sends, with its time limit
    assert "AbortController" in script
