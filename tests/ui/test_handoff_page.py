"""A one-time link's page (``/ui/handoff``): served by Host without a console sign-in, the same
static page for every link (the link's secret and key are in the fragment, never sent), with the
console's security headers and no referrer; no page where this server is not Host. Its AES-GCM
fallback is the vendored build recorded in VENDORED.md. What the page does in a browser:
``tests/ui/browser/test_handoff_page.py``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from app.adapters.agent.crypto import KeyPair
from tests import REPO_ROOT
from tests.ui.conftest import client_of

pytestmark = pytest.mark.anyio
STATIC = REPO_ROOT / "app" / "ui" / "static"


async def test_host_serves_one_static_page_for_every_link_without_sign_in(host_app: tuple[Any, KeyPair]) -> None:
    async with client_of(host_app[0]) as client:
        page = await client.get("/ui/handoff")
        other = await client.get("/ui/handoff", params={"t": "anything"})
        for name in ("qoss-aes.min.js", "handoff.js"):
            script = await client.get(f"/ui/static/{name}")
            assert script.status_code == 200
            assert "javascript" in script.headers["content-type"]
    assert page.status_code == 200
    assert other.text == page.text
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["cache-control"] == "no-store"
    assert re.findall(r'<script src="([^"]+)"', page.text) == ["/ui/static/qoss-aes.min.js", "/ui/static/handoff.js"]
    assert not re.search(r"(src|href)=\"(https?:)?//", page.text)
    assert "Sign out" not in page.text


async def test_a_server_that_is_not_host_has_no_link_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/handoff")
    assert page.status_code == 404
    assert "no one-time links here" in page.text


def test_the_aes_bundle_is_the_recorded_build() -> None:
    record = (STATIC / "VENDORED.md").read_text()
    row = re.search(r"\| `qoss-aes\.min\.js` \|.*?\| `([0-9a-f]{64})` \|", record)
    assert row, record
    assert hashlib.sha256((STATIC / "qoss-aes.min.js").read_bytes()).hexdigest() == row.group(1)
    assert "@noble/ciphers@2.4.0" in row.group(0)
    assert "noble-ciphers" in (STATIC / "qoss-vendor.LICENSE").read_text()
