"""The console on a phone (390x844, touch) and from the keyboard alone, in headless chromium against
a real ``qoss serve``: a row's edit, a conflict with a colleague's edit and its way out, done by
touch with every control on screen; the edit done with the keyboard, the focus where the next
step is and each result announced; no page that scrolls sideways; the page's other forms follow
the grid's revision and a stale replacement keeps its file; a revert asked first."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect

from tests.ui.browser.conftest import NewContext, Served, Watched, no_trouble, save_previewed, sign_in

PHONE: dict[str, Any] = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True}
#: Controls the user may reach in a part of a page.
CONTROLS = "a[href], button, input:not([type=hidden]), select, textarea"
#: Each of a part's visible controls (and texts: ``extra``) that is not wholly inside the viewport once
#: scrolled to vertically; horizontally nothing may need scrolling at all (checked before any scroll).
_OFF_SCREEN = """(root, selector) => {
  const out = [];
  const name = (e) => (e.getAttribute("aria-label") || e.textContent || e.name || e.id || e.tagName).trim()
      .replace(/\\s+/g, " ").slice(0, 60);
  for (const e of root.querySelectorAll(selector)) {
    if (!e.getClientRects().length) continue;  // not rendered (display: none)
    let r = e.getBoundingClientRect();
    if (r.left < 0 || r.right > window.innerWidth + 0.5) out.push(`${name(e)}: x ${r.left}..${r.right}`);
    e.scrollIntoView({block: "nearest"});
    r = e.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight + 0.5) out.push(`${name(e)}: y ${r.top}..${r.bottom}`);
  }
  return out;
}"""


def _on_screen(part: Locator, selector: str = CONTROLS) -> None:
    """Every visible control of ``part`` (``selector``) fits the viewport's width as it is, and its
    height once scrolled to; ``part`` itself scrolls nothing sideways."""
    assert part.evaluate("p => p.scrollWidth <= p.clientWidth"), "the part scrolls sideways"
    offenders = part.evaluate(_OFF_SCREEN, selector)
    assert not offenders, offenders


def _phone(new_context: NewContext) -> tuple[BrowserContext, Page, Watched]:
    context = new_context(**PHONE)
    page = context.new_page()
    return context, page, Watched(page)


def _revision(served: Served, table: str) -> int:
    return int(httpx.get(f"{served.base}/v1/rating-tables/{table}", timeout=10).json()["revision"])


def _patch(served: Served, table: str, keyword: str, body: dict[str, object]) -> int:
    """A colleague's edit of one row through the API (``other-editor``); the revision it made."""
    auth = {"Authorization": f"Bearer {served.other_editor}"}
    current = httpx.get(f"{served.base}/v1/rating-tables/{table}", headers=auth, timeout=10)
    edited = httpx.patch(f"{served.base}/v1/rating-tables/{table}/ratings/{keyword}", json=body, timeout=10,
                         headers={**auth, "If-Match": current.headers["etag"]})
    assert edited.status_code == 200, edited.text
    return int(edited.json()["revision"])


def _rating(served: Served, table: str, keyword: str) -> dict[str, Any]:
    ratings = httpx.get(f"{served.base}/v1/rating-tables/{table}", timeout=10).json()["ratings"]
    return dict(next(r for r in ratings if r["algorithm"] == keyword))


WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_an_edit_and_its_conflict_by_touch_at_phone_width(served: Served, new_context: NewContext,
                                                          screenshots: Path) -> None:
    _, page, watched = _phone(new_context)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    grid = page.locator(".grid-box")
    assert grid.evaluate("b => b.scrollWidth > b.clientWidth")  # the grid is wider than the phone
    page.locator("#row-md5").get_by_role("link", name="Edit md5").tap()

    # the form opens as a panel of its own: the whole width, every field labelled in sight
    form = page.locator("#row-md5.editing")
    expect(form).to_be_visible()
    expect(form.get_by_text("Edit md5 in esaf-2006")).to_be_visible()
    box = form.bounding_box()
    assert box is not None
    assert (box["x"], box["width"]) == (0, 390), box
    for label in ("Integrity of md5", "Performance of md5", "Reason for md5"):
        field = page.get_by_label(label)
        expect(field).to_be_visible()
        shown = form.locator(f'label[for="{field.get_attribute("id")}"]')
        expect(shown).to_be_visible()
        label_box = shown.bounding_box()
        assert label_box is not None and label_box["width"] > 30, label  # noqa: PT018  # in sight, not clipped
    kind = form.locator('td[data-label="Kind"]')  # a value that cannot be edited, named
    expect(kind).to_have_text("integrity")
    assert kind.evaluate("td => getComputedStyle(td, '::before').content") == '"Kind: "'

    _on_screen(form)
    page.screenshot(path=screenshots / "phone-edit.png")

    # a colleague saves the same field meanwhile: the conflict, a panel too, names them
    theirs = _patch(served, "esaf-2006", "md5", {"integrity": 1})
    page.get_by_label("Integrity of md5").fill("3")
    form.get_by_role("button", name="Preview").tap()
    conflict = page.locator("#row-md5.conflict")
    expect(conflict).to_contain_text(re.compile(
        rf"md5 changed while you edited it: other-editor saved revision {theirs} at {WHEN}\."))
    expect(conflict.locator(".clash")).to_contain_text("integrity is 1")
    _on_screen(conflict)
    _on_screen(conflict, ".clash, strong")  # the words, not only the buttons
    page.screenshot(path=screenshots / "phone-conflict.png")
    reapply = conflict.get_by_role("button", name=f"Re-apply mine over revision {theirs}")
    expect(reapply).to_be_focused()

    # re-apply mine: its preview, a panel, then saved
    reapply.tap()
    preview = page.locator("#row-md5.preview")
    expect(preview).to_contain_text("Save md5? Nothing is saved yet.")
    _on_screen(preview)
    save = preview.get_by_role("button", name="Save md5")
    expect(save).to_be_focused()
    save.tap()
    saved = page.locator("#row-md5.saved")
    expect(saved.locator("td").nth(2)).to_have_text("3")
    expect(page.locator("#grid-status")).to_contain_text(f"md5 saved in revision {theirs + 1}.")
    assert _rating(served, "esaf-2006", "md5")["integrity"] == 3
    assert page.evaluate("document.scrollingElement.scrollWidth <= innerWidth")
    no_trouble(watched)


def _focused(page: Page) -> str:
    return str(page.evaluate("() => { const e = document.activeElement; return e === document.body ? 'body' : "
                             "(e.getAttribute('aria-label') || e.textContent || e.name || e.id).trim()"
                             ".replace(/\\s+/g, ' '); }"))


@pytest.mark.parametrize("screen", [{"viewport": {"width": 1280, "height": 800}}, PHONE], ids=["1280", "390"])
def test_the_keyboard_alone_edits_previews_and_saves_with_the_focus_where_the_next_step_is(
        served: Served, new_context: NewContext, screen: dict[str, Any]) -> None:
    page = new_context(**screen).new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    status = page.locator("#grid-status")
    assert (status.get_attribute("role"), status.get_attribute("aria-live")) == ("status", "polite")
    for _ in range(80):  # through the page's controls to the row's Edit control
        page.keyboard.press("Tab")
        if _focused(page) == "Edit sha1":
            break
    assert _focused(page) == "Edit sha1"
    page.keyboard.press("Enter")
    integrity = page.get_by_label("Integrity of sha1")
    expect(integrity).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("7")
    for _ in range(8):  # on through performance and the reason to Preview
        page.keyboard.press("Tab")
        if _focused(page) == "Preview":
            break
    assert _focused(page) == "Preview"
    page.keyboard.press("Enter")

    save = page.locator("#row-sha1.preview").get_by_role("button", name="Save sha1")
    expect(save).to_be_focused()  # not <body>: the next key acts on the preview
    expect(status).to_contain_text("Preview of sha1: nothing is saved yet; no tunnel is running.")
    before = _revision(served, "esaf-2006")
    grid_read = re.compile(r".*/ui/tables/esaf-2006$")
    with page.expect_response(lambda r: bool(grid_read.match(r.url)) and r.request.method == "GET") as reread:
        page.keyboard.press("Enter")  # saved; the save's own event has the grid read again (live.js)

    edit = page.locator("#row-sha1.saved").get_by_role("link", name="Edit sha1")
    expect(edit).to_be_focused()
    expect(status).to_contain_text(f"sha1 saved in revision {before + 1}.")
    assert reread.value.ok
    page.wait_for_timeout(300)  # the read merged in: the saved row kept as it is, highlight and focus
    expect(edit).to_be_focused()
    assert _rating(served, "esaf-2006", "sha1")["integrity"] == 7
    page.keyboard.press("Tab")
    assert _focused(page) == "Remove sha1"  # the next Tab goes on from the row, not from the top

    # a preview cancelled with Escape: the focus back on Edit, nothing saved
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    expect(page.get_by_label("Integrity of sha1")).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Enter")  # Enter in a field submits its form: the preview
    expect(page.locator("#row-sha1.preview").get_by_role("button", name="Save sha1")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#row-sha1").get_by_role("link", name="Edit sha1")).to_be_focused()
    expect(status).to_contain_text(f"sha1 as saved in revision {before + 1}: nothing changed.")
    assert _revision(served, "esaf-2006") == before + 1
    no_trouble(watched)


#: Every console page (and some of their states); the navigation's links are all among them.
PAGES = ["/ui/tables", "/ui/tables/esaf-2006", "/ui/tables/esaf-2006/revisions",
         "/ui/tables/esaf-2006/revert?revision=1", "/ui/tables/esaf-2006/ratings/md5/remove",
         "/ui/tables/esaf-2006/ratings/md5/edit",  # the edit form as a page of its own (without scripts)
         "/ui/policies/voip/revert?revision=1",
         "/ui/negotiate", "/ui/negotiate?run=true&p1=a&p1c=5&p2=b&p2i=4&why=sha1",
         "/ui/negotiate?run=true&p1=a&p1c=11", "/ui/policies", "/ui/policies/voip", "/ui/policies/voip/revisions",
         "/ui/tunnels", "/ui/gateways", "/ui/peers", "/ui/agent", "/ui/measurements", "/ui/audit",
         "/ui/audit?outcome=409",
         "/ui/tokens", "/ui/no-such-page"]


def test_no_console_page_scrolls_sideways_at_phone_width(served: Served, new_context: NewContext,
                                                         screenshots: Path) -> None:
    _patch(served, "esaf-2006", "des", {"reason": "a revision to go back from"})  # history to revert
    auth = {"Authorization": f"Bearer {served.admin}"}
    voip = httpx.get(f"{served.base}/v1/policies/voip", headers=auth, timeout=10).json()
    edited = httpx.put(f"{served.base}/v1/policies/voip", headers={**auth, "If-Match": f'"{voip["revision"]}"'},
                       json={**voip["policy"], "description": "a revision to go back from"}, timeout=10)
    assert edited.status_code == 200, edited.text
    revoke = f"/ui/tokens/{served.reader.split('_')[1]}/revoke"  # the question, not the revocation
    _, page, watched = _phone(new_context)
    page.goto(f"{served.base}/ui/login")
    wide = {}
    if not page.evaluate("document.scrollingElement.scrollWidth <= innerWidth"):
        wide["/ui/login"] = page.evaluate("document.scrollingElement.scrollWidth")
    sign_in(page, served.base, served.admin)
    nav = page.locator("nav[aria-label=Main] a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert set(nav) <= set(PAGES), set(nav) - set(PAGES)
    for path in [*PAGES, revoke]:
        page.goto(f"{served.base}{path}")
        if not page.evaluate("document.scrollingElement.scrollWidth <= innerWidth"):
            wide[path] = page.evaluate("document.scrollingElement.scrollWidth")
    assert not wide, wide
    watched.problems.remove("Failed to load resource: the server responded with a status of 404 (Not Found)")

    # the wide lists say that they scroll sideways, in a box the keyboard can scroll too
    for path, hint in (("/ui/tokens", "#tokens-hint"), ("/ui/audit", "#audit-hint")):
        page.goto(f"{served.base}{path}")
        expect(page.locator(hint)).to_be_visible()
        box = page.locator(f'[aria-describedby="{hint[1:]}"]')
        assert box.get_attribute("tabindex") == "0"
        assert box.evaluate("b => b.scrollWidth > b.clientWidth")
        page.screenshot(path=screenshots / f"phone-{path.rsplit('/', 1)[1]}.png")

    # every label sits above its own field, never on the line of the field before
    for path in ("/ui/negotiate", "/ui/audit", "/ui/gateways", "/ui/measurements", "/ui/tables/esaf-2006"):
        page.goto(f"{served.base}{path}")
        assert page.locator("form.playground label[for]").count() > 0, path
        misplaced = page.evaluate("""() => [...document.querySelectorAll("form.playground label[for]")].flatMap(l => {
            const f = document.getElementById(l.htmlFor), a = l.getBoundingClientRect(), b = f.getBoundingClientRect();
            return a.bottom <= b.top + 1 && Math.abs(a.left - b.left) < 2 ? [] : [l.htmlFor];
        })""")
        assert not misplaced, (path, misplaced)
    no_trouble(watched)


def test_the_pages_forms_follow_the_grid_and_a_stale_replacement_keeps_its_file(
        served: Served, new_context: NewContext, tmp_path: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/standards-2026")
    loaded = _revision(served, "standards-2026")
    page.locator("#row-aes128").get_by_role("link", name="Edit aes128").click()
    page.get_by_label("Reason for aes128").fill("saved in place")
    save_previewed(page, "aes128")
    expect(page.locator("#row-aes128.saved")).to_be_visible()
    for field in ("#add-revision input", "#replace-revision input"):
        expect(page.locator(field)).to_have_value(str(loaded + 1))
    expect(page.locator("#replace-based-on")).to_contain_text(f"based on revision {loaded + 1}")

    # replaced after one's own save: accepted, not stale
    exported = httpx.get(f"{served.base}/v1/rating-tables/standards-2026/export", timeout=10).text
    first = tmp_path / "first.yaml"
    first.write_text(exported.replace("saved in place", "replaced from a file"))
    page.get_by_label("YAML file", exact=True).set_input_files(str(first))
    page.get_by_role("button", name="Replace standards-2026").click()
    expect(page.locator("#table-revision")).to_have_text(f"revision {loaded + 2}")
    assert _rating(served, "standards-2026", "aes128")["reason"] == "replaced from a file"

    # a colleague's edit came first: refused, named, the chosen file kept for the next try
    second = tmp_path / "second.yaml"
    second.write_text(exported.replace("saved in place", "the kept file"))
    theirs = _patch(served, "standards-2026", "aes256", {"reason": "a colleague's edit"})
    page.get_by_label("YAML file", exact=True).set_input_files(str(second))
    page.get_by_role("button", name="Replace standards-2026").click()
    expect(page.get_by_role("alert")).to_contain_text(re.compile(
        rf"revision {theirs} is current now: other-editor saved revision {theirs} at {WHEN}\): nothing was saved"))
    expect(page.locator("#replace-kept")).to_contain_text(
        f"The file you chose is kept ({len(second.read_text().splitlines())} lines)")
    assert _revision(served, "standards-2026") == theirs
    page.get_by_role("button", name="Replace standards-2026").click()  # no file chosen again: the kept one
    expect(page.locator("#table-revision")).to_have_text(f"revision {theirs + 1}")
    assert _rating(served, "standards-2026", "aes128")["reason"] == "the kept file"
    no_trouble(watched)


def test_a_revert_shows_what_it_changes_and_its_impact_before_it_happens(served: Served,
                                                                         new_context: NewContext) -> None:
    back_to = _revision(served, "esaf-2006")
    _patch(served, "esaf-2006", "3des", {"reason": "to be taken back"})
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006/revisions")
    page.get_by_role("link", name=f"Revert to revision {back_to}").click()
    expect(page.get_by_role("heading", name=f"Revert esaf-2006 to revision {back_to}?")).to_be_visible()
    change = page.locator("table.diff tbody tr").filter(has_text="3des")
    expect(change).to_contain_text("to be taken back")
    expect(page.locator(".impact-box")).to_contain_text("No tunnel is running")
    current = _revision(served, "esaf-2006")
    assert _rating(served, "esaf-2006", "3des")["reason"] == "to be taken back"  # asking changed nothing
    page.get_by_role("button", name=f"Revert to revision {back_to}").click()
    expect(page.locator(f"#revision-{current + 1}")).to_contain_text(f"reverted to {back_to}")
    assert _rating(served, "esaf-2006", "3des")["reason"] != "to be taken back"
    no_trouble(watched)
