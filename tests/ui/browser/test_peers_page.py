"""The Peers page in headless chromium against a real ``qoss serve`` with peering on, at phone size
(390x844, touch) and at desktop size, from the keyboard alone: our identity copied, a peer
registered (a refused URL shown beside its field first, the form kept), suspended and revoked
after their confirmations; nothing scrolls sideways; a peer whose URL carries markup opens no
dialog and runs no script."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from app.adapters.agent.crypto import KeyPair
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.bootstrap import prepare_database
from app.domain.tunnels import Gateway
from app.settings import Settings
from app.web.peering import PeerIn
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.secrets import keep_log
from tests.fixtures.served import serving
from tests.ui.browser.conftest import NewContext, Watched, no_trouble, sign_in

QOSS = Path(sys.executable).parent / "qoss"
PHONE: dict[str, Any] = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True}
DESKTOP: dict[str, Any] = {"viewport": {"width": 1280, "height": 800}}
HOSTILE_URL = 'https://x.example/"><script>alert(1)</script><img src=x onerror=alert(2)>'


@dataclass
class PeeredConsole:
    base: str
    admin: str


def _add_gateway(database_url: str) -> None:
    """This side's gateway, as a registration stores it (no charon is asked on this page)."""
    engine = make_engine(database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            uow.gateways.create(Gateway("left", "/run/qoss/none.vici", "10.99.0.1", "left.qoss", ("10.1.0.0/24",)))
            uow.commit()
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def peered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeeredConsole]:
    where = tmp_path_factory.mktemp("served-peers")
    url = f"sqlite:///{where / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    _add_gateway(url)
    env = {**os.environ, "QOSS_PEER_NAME": "site-a", "QOSS_MONITOR_TUNNELS": "false",
           "QOSS_RECONCILE_ON_START": "false", "QOSS_STATE_DIR": str(where / "state"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    try:
        with serving([str(QOSS), "serve", "--database-url", url], env=env, log=where / "serve.log") as (base, _):
            admin = make_token(url, "admin", ["admin"])
            keys = {k: v for k, v in KeyPair.generate("hostile").public.as_dict().items() if k in PeerIn.model_fields}
            r = httpx.post(f"{base}/v1/peers", headers={"Authorization": f"Bearer {admin}"}, timeout=30, json={
                "name": "hostile", "url": HOSTILE_URL, **keys, "gateways": ["left"], "networks": ["10.1.0.0/24"]})
            assert r.status_code == 201, r.text
            yield PeeredConsole(base, admin)
    finally:
        keep_log(where / "serve.log", "peers-serve.log")


def _no_sideways_scroll(page: Page) -> None:
    assert page.evaluate("document.scrollingElement.scrollWidth <= innerWidth"), \
        page.evaluate("document.scrollingElement.scrollWidth")


def _confirm_by_keyboard(page: Page, link: str, heading: str, says: str, button: str) -> None:
    """Reach ``link`` by focus, press Enter; the question names what happens; Enter on its button."""
    page.get_by_role("link", name=link).focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=heading)).to_be_visible()
    expect(page.locator("main")).to_contain_text(says)
    _no_sideways_scroll(page)
    page.get_by_role("button", name=button).focus()
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/ui/peers\?changed="))


@pytest.mark.parametrize(("size", "name"), [(PHONE, "phone-b"), (DESKTOP, "desk-b")], ids=["phone", "desktop"])
def test_register_suspend_and_revoke_a_peer_from_the_keyboard(
        peered: PeeredConsole, new_context: NewContext, screenshots: Path, size: dict[str, Any], name: str) -> None:
    context = new_context(**size)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=peered.base)
    page = context.new_page()
    watched = Watched(page)
    sign_in(page, peered.base, peered.admin)
    page.goto(f"{peered.base}/ui/peers")
    expect(page.get_by_role("heading", name="Our identity")).to_be_visible()
    expect(page.locator("#peer-hostile .url")).to_have_text(HOSTILE_URL)  # shown as text, never markup
    _no_sideways_scroll(page)

    copy = page.get_by_role("button", name="Copy our identity")
    copy.focus()
    page.keyboard.press("Enter")
    expect(page.locator('[data-copied-for="identity-text"]')).to_have_text(re.compile(r"Copied\.|Selected"))
    identity = page.locator("#identity-text").input_value()
    assert '"name": "site-a"' in identity
    if page.locator('[data-copied-for="identity-text"]').text_content() == "Copied.":
        assert page.evaluate("navigator.clipboard.readText()") == identity

    keys = {k: v for k, v in KeyPair.generate(name).public.as_dict().items() if k in PeerIn.model_fields}
    page.get_by_label(re.compile(r"^Name")).focus()
    page.keyboard.type(name)
    page.keyboard.press("Tab")
    page.keyboard.type("ftp://qoss.example")  # refused as the API refuses it
    for key in PeerIn.model_fields:
        if key in keys:
            page.keyboard.press("Tab")
            page.keyboard.type(keys[key])
    page.keyboard.press("Tab")
    page.keyboard.press("Space")  # the gateway "left"
    page.keyboard.press("Tab")
    page.keyboard.type("10.1.0.0/24")
    page.keyboard.press("Tab")
    page.keyboard.type("5")  # confidentiality
    page.keyboard.press("Enter")

    url = page.get_by_label(re.compile(r"^URL"))
    expect(page.locator("#error-url")).to_contain_text("an http(s) URL with a host")
    expect(url).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_role("alert")).to_contain_text("1 field to correct")
    expect(page.get_by_label("left")).to_be_checked()  # what was typed is kept
    _no_sideways_scroll(page)
    page.screenshot(path=screenshots / f"peers-refused-{name}.png", full_page=True)
    page.get_by_role("link", name="url").focus()  # the summary's way to the field
    page.keyboard.press("Enter")
    url.focus()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type(f"https://{name}.example")
    page.keyboard.press("Enter")

    page.wait_for_url(re.compile(r".*/ui/peers\?registered=" + name))
    row = page.locator(f"#peer-{name}")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text(f"https://{name}.example")
    expect(row).to_contain_text("confidentiality 5")
    page.screenshot(path=screenshots / f"peers-{name}.png", full_page=True)

    _confirm_by_keyboard(page, f"Suspend {name}", f"Suspend the peering with {name}?",
                         "The 0 tunnels it carries stay up", f"Suspend {name}")
    expect(page.locator(f"#peer-{name}")).to_contain_text("suspended")
    expect(page.get_by_role("status").first).to_contain_text(f"Peer {name} is suspended.")

    _confirm_by_keyboard(page, f"Revoke {name}", f"Revoke the peering with {name}?",
                         "Revoking ends the 0 tunnels it carries, on both sides", f"Revoke {name}")
    expect(page.locator(f"#peer-{name}")).to_contain_text("revoked")
    expect(page.get_by_role("link", name=f"Revoke {name}")).to_have_count(0)
    _no_sideways_scroll(page)
    no_trouble(watched)


def test_a_peer_registered_elsewhere_shows_without_a_reload(peered: PeeredConsole, new_context: NewContext) -> None:
    page = new_context(**DESKTOP).new_page()
    watched = Watched(page)
    sign_in(page, peered.base, peered.admin)
    page.goto(f"{peered.base}/ui/peers")
    expect(page.locator("html")).to_have_attribute("data-live", "on")
    page.wait_for_timeout(700)  # the stream is open before the peer comes
    keys = {k: v for k, v in KeyPair.generate("elsewhere").public.as_dict().items() if k in PeerIn.model_fields}
    r = httpx.post(f"{peered.base}/v1/peers", headers={"Authorization": f"Bearer {peered.admin}"}, timeout=30, json={
        "name": "elsewhere", "url": "https://elsewhere.example", **keys, "gateways": ["left"],
        "networks": ["10.1.0.0/24"]})
    assert r.status_code == 201, r.text
    expect(page.locator("#peer-elsewhere")).to_contain_text("https://elsewhere.example", timeout=10_000)
    expect(page.locator("#peer-elsewhere")).to_have_class(re.compile("changed"))
    no_trouble(watched)
