"""An edit's impact in headless chromium against a real ``qoss serve`` with running tunnels (a
fake charon that speaks VICI, in this process): edit a rating, **Preview** names the tunnel
it would leave below its minimums and the one it would give a cheaper suite, **Save** stores
it; cancelling another preview changes nothing."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from app.bootstrap import prepare_database
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.served import serving
from tests.ui.browser.conftest import QOSS, NewContext, Watched, no_trouble, sign_in
from tests.unit.services.test_tunnels_service import up_on_initiate

PSK = "a-pre-shared-key-of-32-characters-or-more"
#: Minimums whose suites the edit below changes: aes128gcm16 loses the integrity 8 ``strong``
#: needs, and at confidentiality 10 is cheaper than the aes256gcm16 ``secret`` runs.
TUNNELS = {"strong": {"confidentiality": 8, "integrity": 8}, "secret": {"confidentiality": 9, "integrity": 5}}


class Running:
    """The served console with running tunnels: its base URL, an editor's token, the tunnels."""

    def __init__(self, base: str, editor: str, tunnels: dict[str, dict[str, Any]]) -> None:
        self.base, self.editor, self.tunnels = base, editor, tunnels

    def revision(self) -> int:
        return int(httpx.get(f"{self.base}/v1/rating-tables/standards-2026").json()["revision"])


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    where = tmp_path_factory.mktemp("preview-console")
    url = f"sqlite:///{where / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    admin = make_token(url, "admin", ["admin"])
    editor = make_token(url, "editor", ["ratings:write", "tunnels:read"])
    register(PSK)
    env = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_VICI_SOCKET_DIRS": json.dumps([str(where)]),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    with FakeCharon(where / "left.vici") as fake:
        up_on_initiate(fake)
        try:
            with serving([str(QOSS), "serve", "--database-url", url], env=env, log=where / "serve.log") as (base, _):
                headers = {"Authorization": f"Bearer {admin}"}
                r = httpx.post(f"{base}/v1/gateways", headers=headers, json={
                    "name": "left", "vici_socket": str(fake.socket_path), "ike_address": "10.99.0.1",
                    "inside_networks": ["10.1.0.0/24"]})
                assert r.status_code == 201, r.text
                tunnels = {}
                for n, (label, levels) in enumerate(TUNNELS.items(), start=2):
                    r = httpx.post(f"{base}/v1/tunnels", headers=headers, timeout=30, json={
                        "initiator": "left", "remote_ts": [f"10.{n}.0.0/24"], "min_levels": levels,
                        "peer": {"address": f"10.99.0.{n}", "identity": f"{label}.example", "psk": PSK}})
                    assert r.status_code == 201, r.text
                    tunnels[label] = r.json()
                yield Running(base, editor, tunnels)
        finally:
            keep_log(where / "serve.log", "preview-serve.log")


def test_preview_an_edits_impact_then_save_it(running: Running, new_context: NewContext, screenshots: Path) -> None:
    strong, secret = running.tunnels["strong"], running.tunnels["secret"]
    before = running.revision()
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, running.base, running.editor)
    page.goto(f"{running.base}/ui/tables/standards-2026")
    page.locator("#row-aes128gcm16").get_by_role("link", name="Edit aes128gcm16").click()
    page.get_by_label("Confidentiality of aes128gcm16").fill("10")
    page.get_by_label("Integrity of aes128gcm16").fill("5")
    page.get_by_label("Reason for aes128gcm16").fill("previewed in the browser")
    page.locator("#row-aes128gcm16").get_by_role("button", name="Preview").click()
    preview = page.locator("#row-aes128gcm16.preview")
    expect(preview).to_contain_text("Save aes128gcm16? Nothing is saved yet.")
    expect(preview.locator("table.impact.noncompliant caption")).to_contain_text("moved to their new suite once saved")
    below = preview.locator("table.impact.noncompliant tbody tr")
    expect(below).to_have_count(1)
    expect(below).to_contain_text(strong["id"])
    expect(below.locator("td").nth(0)).to_have_text("aes128gcm16-x25519")
    expect(below.locator("td").nth(1)).to_have_text("aes256gcm16-x25519")
    cheaper = preview.locator("table.impact.changed tbody tr")
    expect(cheaper).to_have_count(1)
    expect(cheaper).to_contain_text(secret["id"])
    expect(cheaper.locator("td").nth(0)).to_have_text("aes256gcm16-x25519")
    expect(cheaper.locator("td").nth(1)).to_have_text("aes128gcm16-x25519")
    preview.screenshot(path=screenshots / "edit-preview.png")
    assert running.revision() == before  # previewed: nothing saved
    preview.get_by_role("button", name="Save aes128gcm16").click()
    saved = page.locator("#row-aes128gcm16.saved")
    expect(saved.locator("td").nth(1)).to_have_text("10")
    expect(saved.locator("td").nth(2)).to_have_text("5")
    expect(page.locator("#table-revision")).to_have_text(f"revision {before + 1}")
    assert running.revision() == before + 1
    # another preview, cancelled: the row as stored, nothing saved
    page.locator("#row-aes128gcm16").get_by_role("link", name="Edit aes128gcm16").click()
    page.get_by_label("Integrity of aes128gcm16").fill("8")
    page.locator("#row-aes128gcm16").get_by_role("button", name="Preview").click()
    page.locator("#row-aes128gcm16.preview").get_by_role("link", name="Cancel").click()
    expect(page.locator("#row-aes128gcm16 td").nth(2)).to_have_text("5")
    assert running.revision() == before + 1
    expect(page.get_by_role("link", name=re.compile("^Edit aes128gcm16"))).to_be_visible()
    no_trouble(watched)
