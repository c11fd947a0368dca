"""The device page (``/ui/device``), a user's own: served by Host without a console sign-in, with
Host's public keys only and the console's security headers; no page where this server is not Host.
Its scripts are the vendored bundle recorded in VENDORED.md and the page's own. What the page does
in a browser: ``tests/ui/browser/test_device_page.py``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from app.domain.agent import b64e
from app.domain.agent.platforms import LABELS
from tests import REPO_ROOT
from tests.fixtures.agent_roles import SERVER_ID
from tests.ui.conftest import assert_users_page, client_of

pytestmark = pytest.mark.anyio
STATIC = REPO_ROOT / "app" / "ui" / "static"


async def test_host_serves_the_page_with_its_public_keys_and_no_sign_in(host_app: tuple[Any, Any]) -> None:
    app, keys = host_app
    async with client_of(app) as client:
        page = await client.get("/ui/device")
    assert_users_page(page, keys)
    assert f'<option value="{SERVER_ID}" data-sign-key="{b64e(keys.public.sign)}">' in page.text
    for label in LABELS.values():
        assert label in page.text
    assert '<script src="/ui/static/qoss-vendor.min.js" defer></script>' in page.text
    assert '<script src="/ui/static/device.js" defer></script>' in page.text


async def test_a_server_that_is_not_host_has_no_device_page(app: Any) -> None:
    async with client_of(app) as client:
        page = await client.get("/ui/device")
    assert page.status_code == 404
    assert "does not play the agent&#39;s Host role" in page.text


async def test_the_page_scripts_are_served_with_the_console_headers(host_app: tuple[Any, Any]) -> None:
    app, _ = host_app
    async with client_of(app) as client:
        for name in ("qoss-vendor.min.js", "device.js"):
            script = await client.get(f"/ui/static/{name}")
            assert script.status_code == 200
            assert "javascript" in script.headers["content-type"]
            assert script.headers["x-content-type-options"] == "nosniff"


def test_the_vendored_bundle_is_the_recorded_build_with_its_licences() -> None:
    record = (STATIC / "VENDORED.md").read_text()
    row = re.search(r"\| `qoss-vendor\.min\.js` \|.*?\| `([0-9a-f]{64})` \|", record)
    assert row, record
    assert hashlib.sha256((STATIC / "qoss-vendor.min.js").read_bytes()).hexdigest() == row.group(1)
    for package in ("@noble/curves@2.4.0", "@noble/hashes@2.4.0", "@noble/ciphers@2.4.0", "qr@0.7.0"):
        assert package in record
    licences = (STATIC / "qoss-vendor.LICENSE").read_text()
    for holder in ("noble-curves", "noble-hashes", "noble-ciphers", "paulmillr-qr"):
        assert holder in licences
    assert licences.count("Permission is hereby granted, free of charge") >= 4
