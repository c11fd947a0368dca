"""An administrator's daily work in headless chromium against a real ``qoss serve``:

- ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with every request that is not to the server
  aborted and counted: none is made, the operations are listed, Authorize takes a token and a
  **Try it out** call carries it and gets 200;
- the console's error and 404 pages keep the navigation;
- a table's revisions at phone width (390 px) scroll nowhere sideways;
- the keyboard alone: the skip link first, an edit form that takes the focus when it opens and
  gives it back to its Edit button on Escape;
- the admin's day, on a console that signs in with the OpenID provider: a token made for a
  colleague (its secret shown once), the colleague's edit through the API arriving live in the
  grid while the admin's own edit form keeps what they typed, an edit of another row saved without
  a conflict, a precise conflict on the same row, a revert, a gateway (a fake charon speaking VICI
  on a UNIX socket) registered, checked and removed, and ``/docs`` with no request leaving.

No CSP violation, no script error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Request, Route, expect

from app.bootstrap import prepare_database
from app.settings import Settings
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.oidc_provider import RunningProvider
from tests.fixtures.secrets import keep_log, register
from tests.ui.browser.conftest import (
    ALICE,
    MAPPING,
    NewContext,
    Served,
    Watched,
    no_trouble,
    oidc_sign_in,
    serve_with_provider,
    session_cookie,
    sign_in,
)


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


class _Daily:
    """A console that signs in with the provider, and the directory of its charons' sockets."""

    def __init__(self, base: str, charons: Path) -> None:
        self.base = base
        self.charons = charons


@pytest.fixture(scope="module")
def daily(provider: RunningProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Daily]:
    workdir = tmp_path_factory.mktemp("admin-day")
    charons = workdir / "charons"
    charons.mkdir()
    url = f"sqlite:///{workdir / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    env = {"QOSS_VICI_SOCKET_DIRS": f'["{charons}"]', "QOSS_GATEWAY_PROBE_TIMEOUT": "5"}
    try:
        with serve_with_provider(provider, workdir, url, MAPPING, "serve", env) as (base, _):
            yield _Daily(base, charons)
    finally:
        keep_log(workdir / "serve.log", "admin-day-serve.log")
        keep_log(workdir / "qoss.db", "admin-day-qoss.db")


def _patch(base: str, token: str, keyword: str, body: dict[str, object]) -> int:
    """A colleague's edit of one row of esaf-2006 through the API; the revision it made."""
    auth = {"Authorization": f"Bearer {token}"}
    table = httpx.get(f"{base}/v1/rating-tables/esaf-2006", headers=auth, timeout=10)
    edited = httpx.patch(f"{base}/v1/rating-tables/esaf-2006/ratings/{keyword}", json=body, timeout=10,
                         headers={**auth, "If-Match": table.headers["etag"]})
    assert edited.status_code == 200, edited.text
    return int(edited.json()["revision"])


def test_the_admins_day(daily: _Daily, new_context: NewContext) -> None:
    context = new_context()
    page = context.new_page()
    watched = Watched(page)
    oidc_sign_in(page, daily.base, ALICE)
    page.wait_for_url(re.compile(r".*/ui/tables$"))
    session_cookie(context)

    # a token for a colleague: its secret once, then never again
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Tokens").click()
    page.get_by_label("Name (who or what it is for)").fill("colleague-bob")
    page.get_by_label("ratings:write").check()
    page.get_by_label("Lifetime in days (1 to 366)").fill("30")
    page.get_by_role("button", name="Make token").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Token colleague-bob is made")
    colleague = page.get_by_label("The token (select it and copy)").input_value()
    register(colleague)  # the secret sweep: never in the database or the server's log
    assert re.fullmatch(r"qoss_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", colleague)
    page.get_by_role("link", name="Back to the tokens").click()
    row = page.locator(f"#token-{colleague.split('_')[1]}")
    expect(row).to_contain_text("colleague-bob")
    expect(row).to_contain_text("alice@example.test")  # who made it
    assert colleague.split("_", 2)[2] not in page.content()

    # the colleague's edit arrives live; the admin's open edit form keeps what they typed
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Rating tables").click()
    with page.expect_response(lambda r: r.url.endswith("/ui/events")) as streaming:
        page.get_by_role("link", name="esaf-2006").click()
    assert streaming.value.status == 200  # answered: it follows every event from now on
    page.locator("#row-md5").get_by_role("link", name="Edit md5").click()
    page.get_by_label("Integrity of md5").fill("3")
    revision = _patch(daily.base, colleague, "sha1", {"integrity": 7, "reason": "bob measured it"})
    changed = page.locator("#row-sha1.changed")
    expect(changed.locator("td").nth(2)).to_have_text("7")
    expect(changed).to_contain_text("bob measured it")
    expect(changed.locator(".live-note")).to_have_text(" (changed elsewhere)")
    expect(page.locator("#table-revision")).to_have_text(f"revision {revision}")
    expect(page.get_by_label("Integrity of md5")).to_have_value("3")  # never replaced
    expect(page.locator("#row-md5.editing")).to_have_count(1)

    # another row, saved over the colleague's revision without a conflict
    page.locator("#row-md5").get_by_role("button", name="Preview").click()
    page.locator("#row-md5.preview").get_by_role("button", name="Save md5").click()
    expect(page.locator("#row-md5.saved").locator("td").nth(2)).to_have_text("3")
    expect(page.locator("#grid-status")).to_contain_text("merged with what others saved since revision 1 (sha1; ")
    expect(page.locator("#row-sha1 td").nth(2)).to_have_text("7")

    # the same row: a precise conflict, naming the row, the field and both values
    page.locator("#row-sha1").get_by_role("link", name="Edit sha1").click()
    page.get_by_label("Integrity of sha1").fill("4")
    theirs = _patch(daily.base, colleague, "sha1", {"integrity": 8})
    expect(page.locator("#table-revision")).to_have_text(f"revision {theirs}")  # the stream moved the heading...
    expect(page.get_by_label("Integrity of sha1")).to_have_value("4")  # ...and left the form alone
    page.locator("#row-sha1").get_by_role("button", name="Preview").click()
    conflict = page.locator("#row-sha1.conflict")
    expect(conflict).to_contain_text(re.compile(  # who made the other change, and when
        rf"sha1 changed while you edited it: colleague-bob saved revision {theirs} at [0-9: -]+ UTC\."))
    expect(conflict.locator("p.clash")).to_have_text(
        f"integrity is 8 in revision {theirs} (theirs); you entered 4; it was 7 in revision {theirs - 1}.")
    differs = conflict.locator("tr.differs")
    expect(differs).to_have_count(1)
    expect(differs.locator("th")).to_have_text("integrity")
    expect(differs.locator("td").nth(0)).to_have_text("8")
    expect(differs.locator("td").nth(1)).to_have_text("4")
    conflict.get_by_role("link", name="Keep theirs").click()
    expect(page.locator("#row-sha1 td").nth(2)).to_have_text("8")

    # and back to the shipped revision
    page.get_by_role("link", name="History and revert").click()
    page.get_by_role("link", name="Revert to revision 1").click()  # asked first, with what it changes
    page.get_by_role("button", name="Revert to revision 1").click()
    expect(page.locator(f"#revision-{theirs + 1}")).to_contain_text("reverted to 1")
    shipped = httpx.get(f"{daily.base}/v1/rating-tables/esaf-2006", timeout=10).json()
    assert {r["algorithm"]: r.get("integrity") for r in shipped["ratings"]}["sha1"] == 5

    # a gateway: registered (its charon read), checked, removed after a confirmation
    with FakeCharon(daily.charons / "edge.vici") as charon:
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Gateways").click()
        page.get_by_label("Name", exact=True).fill("edge")
        page.get_by_label("VICI socket").fill(str(charon.socket_path))
        page.get_by_label("IKE address").fill("10.99.0.1")
        page.get_by_label("Inside networks (one per line, or separated by commas)").fill("10.1.0.0/24")
        page.get_by_role("button", name="Register gateway").click()
        expect(page.get_by_role("status").filter(has_text="Gateway edge is registered.")).to_be_visible()
        expect(page.locator("#gateway-edge")).to_contain_text("10.99.0.1")
        page.locator("#gateway-edge").get_by_role("button", name="Check edge").click()
        expect(page.get_by_role("heading", name="edge checked: its charon answers")).to_be_visible()
        assert charon.count("version") == 2
        page.locator("#gateway-edge").get_by_role("link", name="Remove edge").click()
        page.get_by_role("button", name="Remove edge").click()
        expect(page.get_by_role("status").filter(has_text="Gateway edge is removed.")).to_be_visible()
        expect(page.locator("#gateway-edge")).to_have_count(0)

    # the API's documentation, with no request leaving the machine
    offline = _Offline(context, daily.base)
    page.goto(f"{daily.base}/docs")
    expect(page.locator("#operations-admin-list_tokens_v1_tokens_get")).to_be_visible()
    assert page.locator(".opblock").count() > 30
    assert offline.outside == []
    no_trouble(watched)
