"""More of the console in headless chromium against a real ``qoss serve``: a row added from the
catalogue's suggestions and removed after a confirmation, a YAML file imported (a bad one
refused), a policy edited, why-not in the playground, the tunnel list kept current from the
event stream, the measurements page; the grid's filter and sticky header; an edit form that outlives
its session; and the pages at phone width (375 px: no horizontal page scroll, the grid scrolls in
its own box). No CSP violation, no script error."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.algorithms import lookup
from app.domain.tunnels import Gateway, PeerEnd, TunnelRecord, TunnelState
from tests.ui.browser.conftest import NewContext, Served, Watched, no_trouble, session_cookie, sign_in


def test_add_a_row_from_the_suggestions_and_remove_it(served: Served, new_context: NewContext,
                                                      screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    options = page.locator("#missing-algorithms option")
    assert "sha512" in options.evaluate_all("os => os.map(o => o.value)")
    page.get_by_label("Algorithm keyword").fill("sha512")
    page.get_by_label("Integrity", exact=True).fill("9")
    page.get_by_label("Performance", exact=True).fill("4")
    page.get_by_label("Reason").last.fill("added in the browser")
    page.screenshot(path=screenshots / "add-row.png", full_page=True)
    page.get_by_role("button", name="Add row").click()
    expect(page.locator("#row-sha512")).to_contain_text("added in the browser")
    page.locator("#row-sha512").get_by_role("link", name="Remove sha512").click()
    expect(page.get_by_role("heading", name="Remove sha512 from esaf-2006?")).to_be_visible()
    page.get_by_role("button", name="Remove sha512").click()
    expect(page).to_have_url(re.compile(r".*/ui/tables/esaf-2006$"))
    expect(page.locator("#row-sha512")).to_have_count(0)
    no_trouble(watched)


def test_import_a_yaml_file_and_a_bad_one(served: Served, new_context: NewContext, tmp_path: Path) -> None:
    good = tmp_path / "browser-import.yaml"
    text = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006/export").text
    good.write_text(text.replace("name: esaf-2006", "name: browser-import"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nratings: [\n")
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.get_by_label("YAML file").set_input_files(str(bad))
    page.get_by_role("button", name="Import").click()
    expect(page.get_by_role("alert")).to_contain_text("Nothing imported")
    page.get_by_label("YAML file").set_input_files(str(good))
    page.get_by_role("button", name="Import").click()
    expect(page).to_have_url(re.compile(r".*/ui/tables/browser-import$"))
    expect(page.locator("#row-sha1")).to_be_visible()
    no_trouble(watched)


def test_edit_a_policy_with_its_objective_id(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.admin)
    page.get_by_role("link", name="Policies").click()
    page.get_by_role("link", name="voip", exact=True).click()
    page.get_by_label("Objective-ID").select_option("3")
    page.get_by_label("Integrity ≥").fill("6")
    page.get_by_label("Description").fill("edited in the browser")
    page.screenshot(path=screenshots / "policy.png", full_page=True)
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".preview-box")).to_contain_text("Integrity ≥")
    page.get_by_role("button", name="Save voip").click()
    expect(page.get_by_label("Description")).to_have_value("edited in the browser")
    policy = httpx.get(f"{served.base}/v1/policies/voip").json()["policy"]
    assert (policy["objective_id"], policy["min_levels"]["integrity"]) == (3, 6)
    no_trouble(watched)


def test_why_not_in_the_playground(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.reader)
    page.goto(f"{served.base}/ui/negotiate")
    page.get_by_label("Rating table").select_option("esaf-2006")
    page.get_by_label("Confidentiality ≥").first.fill("8")
    page.get_by_label("Integrity ≥").first.fill("4")
    page.get_by_label("Why not… (an algorithm)").fill("des")
    page.get_by_role("button", name="Negotiate").click()
    why = page.locator("#result .why")
    expect(why).to_contain_text("des is below the minimum of client: its confidentiality level is 2")
    page.screenshot(path=screenshots / "why-not.png")
    no_trouble(watched)


def _add_tunnel(database_url: str, tunnel_id: str) -> None:
    """A tunnel record and its event, as the tunnel service writes them (no charon here)."""
    engine = make_engine(database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            try:
                uow.gateways.get("left")
            except LookupError:
                uow.gateways.create(Gateway("left", "/tmp/none.vici", "10.99.0.1", "10.99.0.1",  # noqa: S108
                                            ("10.1.0.0/24",)))
            uow.tunnels.add(TunnelRecord(
                id=tunnel_id, initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                remote_ts=("10.2.0.0/24",), state=TunnelState.UP,
                negotiation={"suite": {"protocol": "esp"}, "proposals": {"esp": "aes128gcm16-x25519"}},
                peer=PeerEnd("10.99.0.2", "peer.example", "10.99.0.1")))
            uow.events.append("tunnel.created", tunnel_id, {"state": "up"}, scope="tunnels:read")
            uow.commit()
    finally:
        engine.dispose()


def test_the_tunnel_list_follows_the_events(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.reader)
    page.goto(f"{served.base}/ui/tunnels")
    expect(page.locator("html")).to_have_attribute("data-live", "on")
    page.wait_for_timeout(700)  # the stream is open before the tunnel comes
    _add_tunnel(served.database_url, "live0001")
    expect(page.locator("#tunnel-live0001")).to_contain_text("aes128gcm16-x25519", timeout=10_000)
    page.screenshot(path=screenshots / "tunnels.png")
    page.locator("#tunnel-live0001").get_by_role("link").click()
    expect(page.get_by_role("heading", name=re.compile("Tunnel live0001"))).to_be_visible()
    expect(page.get_by_text("does not answer")).to_be_visible()  # no charon behind the socket
    no_trouble(watched)


def test_the_measurements_page(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.get_by_role("link", name="Measurements").click()
    expect(page.get_by_text("AMD EPYC")).to_be_visible()
    expect(page.locator("tr").filter(has_text="aes128gcm16").first).to_be_visible()
    images = page.locator("figure img")
    if images.count():  # the bench extra (matplotlib) is installed: the plots are drawn
        expect(images.first).to_be_visible()
        assert images.first.evaluate("i => i.naturalWidth") > 0
    page.screenshot(path=screenshots / "measurements.png")
    no_trouble(watched)


def _no_page_scroll(page: Page) -> None:
    wide = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    culprits = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => !e.closest('.scroll') && e.getBoundingClientRect().right > document.documentElement.clientWidth)
        .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
    assert wide[0] <= wide[1], f"{page.url}: the page is {wide[0]} px wide in a {wide[1]} px window: {culprits}"


@pytest.mark.parametrize("path", [
    "/ui/tables", "/ui/tables/standards-2026", "/ui/negotiate?run=true&p1=a&p1c=5&why=sha1", "/ui/policies",
    "/ui/policies/voip", "/ui/tunnels", "/ui/gateways", "/ui/agent", "/ui/measurements", "/ui/audit",
    "/ui/tables/standards-2026/revisions"])
def test_at_phone_width_only_the_grid_scrolls_sideways(served: Served, new_context: NewContext, screenshots: Path,
                                                      path: str) -> None:
    page = new_context(viewport={"width": 375, "height": 812}).new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.admin)
    page.goto(f"{served.base}{path}")
    _no_page_scroll(page)
    if path == "/ui/tables/standards-2026":
        box = page.locator(".grid-box").first
        assert box.evaluate("b => b.scrollWidth > b.clientWidth")  # the grid scrolls in its own box
        page.screenshot(path=screenshots / "phone-grid.png")
        box.focus()
        page.keyboard.press("ArrowRight")  # and the keyboard scrolls it (smoothly: wait for it to move)
        page.wait_for_function("() => document.querySelector('.grid-box').scrollLeft > 0", timeout=5000)
    no_trouble(watched)


def test_every_control_is_labelled(served: Served, new_context: NewContext) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.admin)
    for path in ("/ui/tables", "/ui/tables/esaf-2006", "/ui/negotiate", "/ui/policies/voip", "/ui/measurements",
                 "/ui/audit"):
        page.goto(f"{served.base}{path}")
        unlabelled = page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
            .filter(c => !(c.labels && c.labels.length) && !c.getAttribute('aria-label')).map(c => c.name || c.id)""")
        assert not unlabelled, f"{path}: {unlabelled}"
    no_trouble(watched)


def _matching(served: Served, table: str, wanted: str) -> list[str]:
    """The rows of ``table`` whose algorithm, kind or reason holds ``wanted`` (any case), from the API."""
    ratings = httpx.get(f"{served.base}/v1/rating-tables/{table}", timeout=10).json()["ratings"]
    return [r["algorithm"] for r in ratings
            if any(wanted.lower() in str(v).lower() for v in (r["algorithm"], lookup(r["algorithm"]).kind,
                                                                 r.get("reason") or ""))]


def test_the_grid_filters_as_one_types_under_a_sticky_header(served: Served, new_context: NewContext) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/standards-2026")
    count = page.locator("#grid-filter-count")
    expect(count).to_have_text("84 of 84 shown")
    shown = page.locator("#grid-rows > tr:visible")
    # the header row stays at the top of the grid's box while the rows scroll under it
    box = page.locator(".grid-box")
    box.evaluate("b => { b.scrollTop = 900; }")
    assert page.evaluate("""() => {
        const box = document.querySelector('.grid-box').getBoundingClientRect();
        const head = document.querySelector('table.ratings thead');
        return getComputedStyle(head).position === 'sticky' && Math.abs(head.getBoundingClientRect().top - box.top) < 2
            && getComputedStyle(head.querySelector('th')).backgroundColor !== 'rgba(0, 0, 0, 0)'; }""")
    # by the keyboard: Tab from the last link above the grid reaches the field; typing filters (any case)
    page.get_by_role("link", name="Negotiate with this table").focus()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Filter by algorithm, kind or reason")).to_be_focused()
    page.keyboard.type("GCM")
    gcm = _matching(served, "standards-2026", "gcm")
    expect(count).to_have_text(f"{len(gcm)} of 84 shown")
    expect(shown).to_have_count(len(gcm))
    assert sorted(shown.evaluate_all("rows => rows.map(r => r.id.slice(4))")) == sorted(gcm)
    # an htmx swap of a row (edit, then cancel with Escape) keeps the filter
    page.locator("#row-aes128gcm16").get_by_role("link", name="Edit aes128gcm16").click()
    expect(page.locator("#row-aes128gcm16.editing")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#row-aes128gcm16.editing")).to_have_count(0)
    expect(count).to_have_text(f"{len(gcm)} of 84 shown")
    expect(page.locator("#row-x25519")).to_be_hidden()
    # a row changed elsewhere (live.js replaces it) is filtered as it comes: x25519 now matches
    expect(page.locator("html")).to_have_attribute("data-live", "on")
    auth = {"Authorization": f"Bearer {served.admin}"}
    table = httpx.get(f"{served.base}/v1/rating-tables/standards-2026", headers=auth, timeout=10)
    edited = httpx.patch(f"{served.base}/v1/rating-tables/standards-2026/ratings/x25519", timeout=10,
                         headers={**auth, "If-Match": table.headers["etag"]},
                         json={"reason": "Curve25519, as common as AES-GCM"})
    assert edited.status_code == 200, edited.text
    expect(page.locator("#row-x25519.changed")).to_be_visible(timeout=10_000)
    expect(count).to_have_text(f"{len(gcm) + 1} of 84 shown")
    page.get_by_label("Filter by algorithm, kind or reason").press("Escape")  # Escape empties the filter
    expect(count).to_have_text("84 of 84 shown")
    no_trouble(watched)


def test_an_edit_outlives_its_session_and_is_saved_after_signing_in_again(
        served: Served, new_context: NewContext, screenshots: Path) -> None:
    admin = new_context()
    page = admin.new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/standards-2026")
    page.locator("#row-aes256").get_by_role("link", name="Edit aes256").click()
    expect(page.get_by_label("Confidentiality of aes256")).to_be_visible()
    expect(page.locator("#row-aes256 input[name=integrity]")).to_have_count(0)  # a cipher: no integrity
    page.get_by_label("Confidentiality of aes256").fill("9")
    page.get_by_label("Reason for aes256").fill("typed while the session ended")
    # the same session signed out from another browser
    elsewhere = new_context()
    elsewhere.add_cookies([{"name": "qoss_session", "value": session_cookie(admin), "url": f"{served.base}/ui"}])
    other = elsewhere.new_page()
    other.goto(f"{served.base}/ui/tables")
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(re.compile(r".*/ui/login$"))
    page.locator("#row-aes256").get_by_role("button", name="Preview").click()
    notice = page.get_by_role("alert")
    expect(notice).to_have_text("Your session has ended: sign in again in a new tab, then save again — "
                                "what you typed is kept.")
    link = notice.get_by_role("link", name="sign in again in a new tab")
    assert (link.get_attribute("target"), link.get_attribute("rel")) == ("_blank", "noopener")
    expect(page).to_have_url(f"{served.base}/ui/tables/standards-2026")
    expect(page.locator("#row-aes256.editing")).to_be_visible()
    expect(page.get_by_label("Confidentiality of aes256")).to_have_value("9")
    expect(page.get_by_label("Reason for aes256")).to_have_value("typed while the session ended")
    page.screenshot(path=screenshots / "session-ended.png")
    # signed in again in a new tab of the same browser: the save goes through, with the new session
    with admin.expect_page() as opened:
        link.click()
    tab = opened.value
    tab.wait_for_load_state()
    expect(tab).to_have_url(re.compile(r".*/ui/login$"))
    sign_in(tab, served.base, served.editor)
    page.bring_to_front()
    page.locator("#row-aes256").get_by_role("button", name="Preview").click()
    page.locator("#row-aes256.preview").get_by_role("button", name="Save aes256").click()
    expect(page.locator("#row-aes256.saved td").nth(1)).to_have_text("9")
    expect(page.get_by_role("alert")).to_have_count(0)
    rating = next(r for r in httpx.get(f"{served.base}/v1/rating-tables/standards-2026", timeout=10).json()["ratings"]
                  if r["algorithm"] == "aes256")
    assert (rating["confidentiality"], rating["reason"]) == (9, "typed while the session ended")
    no_trouble(watched)
