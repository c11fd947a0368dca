"""The console's pages as HTML: error and 404 pages keep the navigation, every page opens with a
skip link to its main content, and moments are shown to the second in UTC inside ``<time>``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from app.ui.render import when
from tests.ui.conftest import sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
_NAV = '<nav aria-label="Main">'
_FIRST_IN_BODY = re.compile(r"<body[^>]*>\s*<a class=\"skip\" href=\"#main\">Skip to main content</a>")
_SHOWN = re.compile(r'<time datetime="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)">'
                    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)</time>")


async def test_an_unknown_console_path_is_a_404_page_with_the_navigation(browser: Browser,
                                                                         token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("reader", ["tunnels:read"]))
    answer = await client.get("/ui/no/such/page")
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("text/html")
    assert "Page not found" in answer.text and _NAV in answer.text  # noqa: PT018
    assert 'href="/ui/tunnels"' in answer.text  # the token's own sections
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")


async def test_a_404_page_without_a_session_has_no_navigation(browser: Browser) -> None:
    answer = await browser().get("/ui/no-such-page")
    assert answer.status_code == 404
    assert "Page not found" in answer.text and _NAV not in answer.text  # noqa: PT018


async def test_an_error_page_keeps_the_navigation(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("editor", ["ratings:write"]))
    missing = await client.get("/ui/tables/no-such-table")
    assert missing.status_code == 404
    assert _NAV in missing.text and "Signed in as" in missing.text  # noqa: PT018
    forbidden = await client.get("/ui/audit")  # not this token's: 403 page, still with its navigation
    assert forbidden.status_code == 403
    assert _NAV in forbidden.text


async def test_every_page_opens_with_the_skip_link(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    assert _FIRST_IN_BODY.search((await client.get("/ui/login")).text)
    await sign_in(client, token("admin", ["admin"]))
    for path in ("/ui/tables", "/ui/tables/esaf-2006", "/ui/tables/esaf-2006/revisions", "/ui/negotiate",
                 "/ui/policies", "/ui/tunnels", "/ui/gateways", "/ui/agent", "/ui/measurements", "/ui/audit",
                 "/ui/tokens", "/ui/nowhere"):
        html = (await client.get(path)).text
        assert _FIRST_IN_BODY.search(html), path
        assert '<main id="main" tabindex="-1">' in html, path


async def test_history_and_lists_show_moments_to_the_second_in_utc(browser: Browser,
                                                                   token: Callable[..., str]) -> None:
    client = browser()
    admin = token("admin", ["admin"])
    await sign_in(client, admin)
    for path in ("/ui/tables/esaf-2006/revisions", "/ui/tables", "/ui/audit"):
        html = (await client.get(path)).text
        shown = _SHOWN.findall(html)
        assert shown, path
        for exact, text in shown:
            moment = datetime.fromisoformat(exact)
            assert moment.tzinfo is not None
            assert text == moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}(?!Z\")", html), path  # no microseconds shown


def test_when_renders_a_moment_a_day_and_leaves_other_text_alone() -> None:
    assert str(when(datetime(2026, 11, 27, 2, 31, 5, 123456, tzinfo=UTC))) == \
        '<time datetime="2026-11-27T02:31:05.123456Z">2026-11-27 02:31:05 UTC</time>'
    assert str(when("2026-11-27T03:31:05+01:00")) == \
        '<time datetime="2026-11-27T02:31:05Z">2026-11-27 02:31:05 UTC</time>'
    assert str(when(datetime(2026, 11, 27, 2, 31, 5))) == \
        '<time datetime="2026-11-27T02:31:05Z">2026-11-27 02:31:05 UTC</time>'  # naive: UTC
    assert str(when("2026-11-23")) == '<time datetime="2026-11-23">2026-11-23</time>'
    assert when("yesterday<b>") == "yesterday<b>"  # plain text: the template escapes it
    assert when(None) == "" and when("") == ""  # noqa: PT018
