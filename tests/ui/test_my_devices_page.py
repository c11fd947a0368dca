"""The user's own devices page (``/ui/my-devices``): served by Host without a console sign-in,
with Host's public keys only and the console's security headers, scripts from this server alone;
no page where this server is not Host. What the page does in a browser:
``tests/ui/browser/test_my_devices.py``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.domain.agent import b64e
from app.domain.agent.platforms import LABELS
from tests import REPO_ROOT
from tests.fixtures.agent_roles import SERVER_ID
from tests.ui.conftest import assert_users_page, client_of

pytestmark = pytest.mark.anyio


async def test_host_serves_the_page_with_public_keys_only_and_no_sign_in(host_app: tuple[Any, Any]) -> None:
    app, keys = host_app
    async with client_of(app) as client:
        page = await client.get("/ui/my-devices")
    assert_users_page(page, keys)
    assert f'data-target="{SERVER_ID}" data-sign-key="{b64e(keys.public.sign)}"' in page.text
    for name, label in LABELS.items():
        assert f'<li data-platform="{name}">{label}</li>' in page.text
    assert "ask your administrator for a new invitation" in page.text
    # Every script and link is this server's own.
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert src.startswith(("/ui/static/", "data:")), src


async def test_a_server_that_is_not_host_has_no_devices_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/my-devices")
    assert page.status_code == 404


def test_the_pages_script_asks_nothing_of_any_other_host_and_times_every_request() -> None:
    script = (REPO_ROOT / "app" / "ui" / "static" / "my-devices.js").read_text()
    assert "http://" not in script and "https://" not in script  # noqa: PT018
    assert script.count("fetch(") == 1  # one place sends, with its time limit
    assert "AbortController" in script
