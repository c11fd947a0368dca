"""The console in headless chromium against a real ``qoss serve``: sign in, edit a cell, a
conflicting edit from a second browser, revert, the playground, a read-only token, hostile
text, sign out. htmx runs under the console's CSP: no violation, no script error."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from playwright.sync_api import expect

from tests.ui.browser.conftest import NewContext, Served, Watched, no_trouble, save_previewed, sign_in


def test_sign_in_edit_a_cell_in_place_and_sign_out(served: Served, new_context: NewContext,
                                                   screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    page.goto(f"{served.base}/ui/tables")
    expect(page).to_have_url(re.compile(r".*/ui/login$"))  # no session: the sign-in page
    page.screenshot(path=screenshots / "login.png")
    sign_in(page, served.base, served.editor)
    expect(page.get_by_text("Signed in as")).to_contain_text("editor")
    page.get_by_role("link", name="esaf-2006").click()
    row = page.locator("#row-sha1")
    row.get_by_role("link", name="Edit sha1").click()
    expect(page.locator("#row-sha1.editing")).to_be_visible()
    page.get_by_label("Integrity of sha1").fill("6")
    page.get_by_label("Reason for sha1").fill("edited in the browser")
    save_previewed(page, "sha1")
    saved = page.locator("#row-sha1.saved")
    expect(saved).to_contain_text("edited in the browser")
    expect(saved.locator("td").nth(2)).to_have_text("6")
    expect(page.locator("#table-revision")).to_have_text("revision 2")  # swapped out of band
    page.screenshot(path=screenshots / "rating-table.png", full_page=True)
    api = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006").json()
    assert next(r for r in api["ratings"] if r["algorithm"] == "sha1")["integrity"] == 6
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r".*/ui/login$"))
    page.goto(f"{served.base}/ui/tables")
    expect(page).to_have_url(re.compile(r".*/ui/login$"))
    no_trouble(watched)


def test_a_conflicting_edit_from_a_second_browser(served: Served, new_context: NewContext,
                                                  screenshots: Path) -> None:
    alice, bob = new_context().new_page(), new_context().new_page()
    watched = [Watched(alice), Watched(bob)]
    sign_in(alice, served.base, served.editor)
    sign_in(bob, served.base, served.other_editor)
    for page in (alice, bob):
        page.goto(f"{served.base}/ui/tables/esaf-2006")
        page.locator("#row-md5").get_by_role("link", name="Edit md5").click()
        expect(page.locator("#row-md5.editing")).to_be_visible()
    bob.get_by_label("Integrity of md5").fill("1")
    save_previewed(bob, "md5")
    expect(bob.locator("#row-md5.saved")).to_be_visible()
    alice.get_by_label("Integrity of md5").fill("3")
    alice.locator("#row-md5").get_by_role("button", name="Preview").click()
    conflict = alice.locator("#row-md5.conflict")
    expect(conflict).to_contain_text("md5 changed while you edited it")
    expect(conflict.locator("tr.differs").filter(has_text="integrity")).to_contain_text("1")
    alice.screenshot(path=screenshots / "conflict.png", full_page=True)
    conflict.get_by_role("button", name=re.compile("Re-apply mine over revision")).click()
    alice.locator("#row-md5.preview").get_by_role("button", name="Save md5").click()
    expect(alice.locator("#row-md5.saved").locator("td").nth(2)).to_have_text("3")
    # the other way out: bob, now stale, keeps theirs
    bob.locator("#row-md5").get_by_role("link", name="Edit md5").click()
    bob.get_by_label("Integrity of md5").fill("2")
    alice.goto(f"{served.base}/ui/tables/esaf-2006")
    alice.locator("#row-md5").get_by_role("link", name="Edit md5").click()
    alice.get_by_label("Integrity of md5").fill("4")
    save_previewed(alice, "md5")
    expect(alice.locator("#row-md5.saved")).to_be_visible()
    bob.locator("#row-md5").get_by_role("button", name="Preview").click()
    bob.locator("#row-md5.conflict").get_by_role("link", name="Keep theirs").click()
    expect(bob.locator("#row-md5").locator("td").nth(2)).to_have_text("4")
    no_trouble(*watched)


def test_history_and_a_revert_asked_first(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/standards-2026")
    page.locator("#row-aes128").get_by_role("link", name="Edit aes128").click()
    page.get_by_label("Reason for aes128").fill("a reason to take back")
    save_previewed(page, "aes128")
    expect(page.locator("#row-aes128.saved")).to_be_visible()
    page.get_by_role("link", name="History and revert").click()
    expect(page.locator("#revision-2")).to_contain_text("a reason to take back")
    page.screenshot(path=screenshots / "revisions.png")
    page.get_by_role("link", name="Revert to revision 1").click()
    expect(page.locator("table.diff")).to_contain_text("a reason to take back")  # what it changes, first
    page.screenshot(path=screenshots / "revert.png")
    page.get_by_role("button", name="Revert to revision 1").click()
    expect(page.locator("#revision-3")).to_contain_text("reverted to 1")
    api = httpx.get(f"{served.base}/v1/rating-tables/standards-2026").json()
    assert api["revision"] == 3
    assert next(r for r in api["ratings"] if r["algorithm"] == "aes128")["reason"] != "a reason to take back"
    no_trouble(watched)


def test_the_negotiation_playground(served: Served, new_context: NewContext, screenshots: Path) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.reader)
    page.get_by_role("link", name="Playground").click()
    page.get_by_label("Rating table").select_option("esaf-2006")
    page.get_by_label("Name").first.fill("client")
    page.get_by_label("Confidentiality ≥").first.fill("8")
    page.get_by_label("Integrity ≥").first.fill("4")
    page.get_by_role("button", name="Negotiate").click()
    result = page.locator("#result")
    peer = {"name": "client", "min_levels": {"confidentiality": 8, "integrity": 4}}
    api = httpx.post(f"{served.base}/v1/negotiations", json={"rating_table": "esaf-2006", "peers": [peer]}).json()
    esp = api["proposals"]["esp"]  # other tests here edit esaf-2006: the API says what is cheapest now
    expect(result.locator("code.suite")).to_have_text(esp)
    expect(result).to_contain_text(f"esp_proposals = {esp}")
    expect(result).to_contain_text(f"proposals = {api['ike']['proposal']}")
    expect(result.locator("table.rejected")).to_contain_text("confidentiality 2 < 8 required by client")
    expect(page).to_have_url(re.compile(r"run=true.*table=esaf-2006"))  # htmx pushed a bookmarkable URL
    expect(page.locator(".facts")).to_contain_text("client: confidentiality 8, integrity 4")
    page.screenshot(path=screenshots / "playground.png")
    no_trouble(watched)


def test_a_read_only_token_sees_no_edit_control_and_its_forged_post_is_refused(
        served: Served, new_context: NewContext) -> None:
    context = new_context()
    page = context.new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.reader)
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    expect(page.locator("#row-sha256")).to_be_visible()
    expect(page.get_by_role("link", name=re.compile("^Edit"))).to_have_count(0)
    page.goto(f"{served.base}/ui/tables/esaf-2006/revisions")
    expect(page.get_by_role("button", name=re.compile("^Revert"))).to_have_count(0)
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    before = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006").json()["revision"]
    forged = context.request.post(f"{served.base}/ui/tables/esaf-2006/ratings/sha256", form={
        "csrf": csrf or "", "revision": str(before), "integrity": "1", "performance": "3", "reason": "forged"})
    assert forged.status == 403
    assert httpx.get(f"{served.base}/v1/rating-tables/esaf-2006").json()["revision"] == before
    no_trouble(watched)


def test_hostile_text_renders_inert(served: Served, new_context: NewContext) -> None:
    hostile = '<script>alert("xss")</script><img src=x onerror=alert(1)>'
    headers = {"Authorization": f"Bearer {served.admin}"}
    table = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006").json()
    answer = httpx.patch(f"{served.base}/v1/rating-tables/esaf-2006/ratings/des", json={"reason": hostile},
                         headers={**headers, "If-Match": f'"{table["revision"]}"'})
    assert answer.status_code == 200, answer.text
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    for path in ("/ui/tables/esaf-2006", "/ui/tables/esaf-2006/revisions"):
        page.goto(f"{served.base}{path}")
        expect(page.get_by_text(hostile).first).to_be_visible()
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    page.locator("#row-des").get_by_role("link", name="Edit des").click()
    expect(page.get_by_label("Reason for des")).to_have_value(hostile)
    assert page.locator("img").count() == 0
    no_trouble(watched)


def test_an_edit_from_an_older_grid_lands_and_a_true_conflict_is_named(
        served: Served, new_context: NewContext, screenshots: Path) -> None:
    """A colleague edits one row through the API; the admin's edit of another row from the older
    grid is saved over it (the whole grid at the new revision, saying so); then both change one
    field of a row, and the conflict names it with both values and lets the admin keep theirs."""
    table = "merge-walk"
    admin = {"Authorization": f"Bearer {served.admin}"}
    shipped = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006").json()
    made = httpx.post(f"{served.base}/v1/rating-tables", headers=admin, json={
        "name": table, "description": "", "source": "", "ratings": shipped["ratings"]})
    assert made.status_code == 201, made.text

    def colleague(algorithm: str, body: dict[str, object], revision: int) -> None:
        r = httpx.patch(f"{served.base}/v1/rating-tables/{table}/ratings/{algorithm}", json=body,
                        headers={"Authorization": f"Bearer {served.other_editor}", "If-Match": f'"{revision}"'})
        assert r.status_code == 200, r.text

    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/{table}")
    expect(page.locator("#table-revision")).to_have_text("revision 1")
    colleague("aes128", {"confidentiality": 7}, 1)  # the admin's grid still shows revision 1
    page.locator("#row-md5").get_by_role("link", name="Edit md5").click()
    page.get_by_label("Integrity of md5").fill("1")
    save_previewed(page, "md5")
    expect(page.locator("#row-md5.saved td").nth(2)).to_have_text("1")
    expect(page.locator("#row-aes128 td").nth(1)).to_have_text("7")  # the colleague's value, under its heading
    expect(page.locator("#table-revision")).to_have_text("revision 3")
    expect(page.locator("#grid-status")).to_contain_text(
        "Your edit of md5 is saved in revision 3, merged with what others saved since revision 1 (aes128; "
        "other-editor saved revision 2 at ")
    page.screenshot(path=screenshots / "merged-save.png", full_page=True)

    page.locator("#row-md5").get_by_role("link", name="Edit md5").click()
    page.get_by_label("Integrity of md5").fill("4")
    colleague("md5", {"integrity": 3}, 3)  # the same field, first
    page.locator("#row-md5").get_by_role("button", name="Preview").click()
    conflict = page.locator("#row-md5.conflict")
    expect(conflict).to_contain_text("integrity is 3 in revision 4 (theirs); you entered 4; it was 1 in revision 3.")
    expect(conflict.locator("tr.differs").filter(has_text="integrity").locator("td")).to_have_text(["3", "4", "1"])
    expect(conflict.get_by_role("button", name="Re-apply mine over revision 4")).to_be_visible()
    expect(page.locator("#table-revision")).to_have_text("revision 4")
    conflict.screenshot(path=screenshots / "row-conflict.png")
    conflict.get_by_role("link", name="Keep theirs").click()
    expect(page.locator("#row-md5 td").nth(2)).to_have_text("3")
    expect(page.get_by_role("link", name="Edit md5")).to_be_visible()
    assert httpx.get(f"{served.base}/v1/rating-tables/{table}").json()["revision"] == 4
    no_trouble(watched)
