"""The invitation's page (``/ui/join``): public and static (the same for every invitation: the secret
is in the link's fragment, which never reaches the server), Host's public keys only, the console's
security headers and no referrer, its scripts this server's own; no page where this server is not
Host. What the page does in a phone's browser: ``tests/ui/browser/test_phone_join.py``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.domain.agent import b64e
from tests.ui.conftest import assert_users_page, client_of

pytestmark = pytest.mark.anyio


async def test_the_join_page_is_static_and_carries_public_keys_only(host_app: tuple[Any, Any]) -> None:
    app, keys = host_app
    async with client_of(app) as client:
        page = await client.get("/ui/join")
        other = await client.get("/ui/join", params={"i": "x" * 43})
    assert_users_page(page, keys)
    assert page.text == other.text  # nothing of a request shapes it
    assert page.headers["referrer-policy"] == "no-referrer"
    assert f'data-sign-key="{b64e(keys.public.sign)}"' in page.text
    assert re.findall(r'<script src="([^"]+)"', page.text) == [
        "/ui/static/qoss-vendor.min.js", "/ui/static/agent-client.js", "/ui/static/phone-keys.js",
        "/ui/static/join.js"]
    assert re.findall(r'name="platform" value="([a-z]+)"', page.text) == ["android", "apple", "windows",
                                                                           "networkmanager"]


async def test_a_server_that_is_not_host_has_no_join_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/join")
    assert page.status_code == 404
    assert "there are no invitations here" in page.text
