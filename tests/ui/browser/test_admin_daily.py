"""An administrator's daily work in headless chromium against a real ``qoss serve``:

- ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with every request that is not to the server
  aborted and counted: none is made, the operations are listed, Authorize takes a token and a
  **Try it out** call carries it and gets 200;
- the console's error and 404 pages keep the navigation;
- a table's revisions at phone width (390 px) scroll nowhere sideways;
- the keyboard alone: the skip link first, an edit form that takes the focus when it opens and
  gives it back to its Edit button on Escape.

No CSP violation, no script error.
"""

from __future__ import annotations

import re

from playwright.sync_api import BrowserContext, Page, Request, Route, expect

from tests.ui.browser.conftest import NewContext, Served, Watched, no_trouble, sign_in


class _Offline:
    """A browser context whose requests go to the served console only: any other is aborted
    and kept in ``outside``."""

    def __init__(self, context: BrowserContext, base: str) -> None:
        self.base = base
        self.outside: list[str] = []
        context.route("**/*", self._route)

    def _route(self, route: Route) -> None:
        url = route.request.url
        if url.startswith((f"{self.base}/", "data:", "blob:")):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()


def test_swagger_ui_works_offline_and_sends_the_token(served: Served, new_context: NewContext) -> None:
    context = new_context()
    offline = _Offline(context, served.base)
    page = context.new_page()
    watched = Watched(page)
    sent: list[Request] = []
    page.on("request", lambda r: sent.append(r) if r.url.endswith("/v1/tokens") else None)
    page.goto(f"{served.base}/docs")
    operation = page.locator("#operations-admin-list_tokens_v1_tokens_get")
    expect(operation).to_be_visible()
    assert page.locator(".opblock").count() > 30  # every operation of the document is listed
    page.locator(".auth-wrapper").get_by_role("button", name="Authorize").click()
    page.locator("#auth-bearer-value").fill(served.admin)  # the bearer scheme's one field
    page.get_by_role("button", name="Apply credentials").click()
    page.locator(".modal-ux").get_by_role("button", name="Close", exact=True).click()
    operation.locator(".opblock-summary-control").click()
    operation.get_by_role("button", name="Try it out").click()
    with page.expect_response(re.compile(r".*/v1/tokens$")) as answered:
        operation.get_by_role("button", name="Execute").click()
    assert answered.value.status == 200
    expect(operation.locator(".live-responses-table tbody .response-col_status")).to_have_text("200")
    assert [r.headers.get("authorization") for r in sent] == [f"Bearer {served.admin}"]
    assert offline.outside == []
    no_trouble(watched)


def test_redoc_works_offline(served: Served, new_context: NewContext) -> None:
    context = new_context()
    offline = _Offline(context, served.base)
    page = context.new_page()
    watched = Watched(page)
    page.goto(f"{served.base}/redoc")
    expect(page.get_by_role("heading", name="qoss (0.1.0)")).to_be_visible()
    operations = page.locator("[data-section-id^='operation/']")
    assert operations.count() > 30  # every operation of the document
    tokens = page.locator("[data-section-id='operation/list_tokens_v1_tokens_get']")
    tokens.scroll_into_view_if_needed()
    expect(tokens.get_by_role("heading", name="List Tokens")).to_be_visible()
    assert offline.outside == []
    no_trouble(watched)


def test_error_and_404_pages_keep_the_navigation(served: Served, new_context: NewContext) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.reader)
    for path, status in (("/ui/no/such/page", 404), ("/ui/tables/no-such-table", 404), ("/ui/audit", 403)):
        answer = page.goto(f"{served.base}{path}")
        assert answer is not None
        assert answer.status == status, path
        nav = page.get_by_role("navigation", name="Main")
        expect(nav).to_be_visible()
        nav.get_by_role("link", name="Tunnels").click()  # the navigation works from there
        expect(page).to_have_url(re.compile(r".*/ui/tunnels$"))
    watched.problems = [p for p in watched.problems if "status of 404" not in p]  # the 404s asked for
    no_trouble(watched)


def test_revisions_do_not_scroll_sideways_at_phone_width(served: Served, new_context: NewContext) -> None:
    import httpx

    auth = {"Authorization": f"Bearer {served.editor}"}
    table = httpx.get(f"{served.base}/v1/rating-tables/esaf-2006", headers=auth)
    long_source = "https://nvlpubs.nist.gov/nistpubs/SpecialPublications/NIST.SP.800-57pt1r5.pdf#page=54-table-2"
    edited = httpx.patch(f"{served.base}/v1/rating-tables/esaf-2006/ratings/md5", json={"reason": long_source},
                         headers={**auth, "If-Match": table.headers["etag"]})
    assert edited.status_code == 200, edited.text
    page = new_context(viewport={"width": 390, "height": 844}).new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006/revisions")
    expect(page.get_by_text(long_source).first).to_be_visible()
    widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], widths
    shown = page.locator(".revisions time").first
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown.inner_text())
    assert shown.get_attribute("datetime")
    no_trouble(watched)


def _focused(page: Page) -> str:
    """What has the focus: its text, or its id for a field."""
    return str(page.evaluate("() => { const e = document.activeElement;"
                             " return e.matches('input, textarea, select, main') ? '#' + e.id"
                             " : e.textContent.trim().replace(/\\s+/g, ' '); }"))


def test_the_keyboard_alone_skips_opens_and_cancels_an_edit(served: Served, new_context: NewContext) -> None:
    page = new_context().new_page()
    watched = Watched(page)
    sign_in(page, served.base, served.editor)
    page.goto(f"{served.base}/ui/tables/esaf-2006")
    page.keyboard.press("Tab")
    assert _focused(page) == "Skip to main content"  # the first stop of every page
    page.keyboard.press("Enter")
    assert _focused(page) == "#main"
    for _ in range(60):  # on through the page's controls to the row's Edit button
        page.keyboard.press("Tab")
        if _focused(page) == "Edit sha1":
            break
    assert _focused(page) == "Edit sha1"
    page.keyboard.press("Enter")
    expect(page.locator("#row-sha1.editing")).to_be_visible()
    expect(page.locator("#row-sha1.editing input:not([type=hidden])").first).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Escape")
    expect(page.locator("#row-sha1.editing")).to_have_count(0)
    expect(page.locator("#row-sha1").get_by_role("link", name="Edit sha1")).to_be_focused()
    no_trouble(watched)
