"""The pages that show changing data follow the console's event stream (``static/live.js`` merges
what changed, row by row, by id): each names the events it follows, the subject it is about and
where it reads itself again, and every row it merges has an id. The policy page never replaces
its form: a change elsewhere is a notice. ``/ui/events`` opens only for a live session, and a
stream ends once its session is signed out."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from tests.ui.conftest import HTMX, client_of, sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})


class _Followers(HTMLParser):
    """The elements of a page that follow events: their attributes and the ids of their children."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict[str, Any]] = {}
        self._depth = 0
        self._open: list[tuple[str, int]] = []  # (id, depth) of the followers being read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        if self._open and self._depth == self._open[-1][1] + 1:
            self.found[self._open[-1][0]]["rows"].append(attributes.get("id"))
        if "data-events" in attributes:
            self.found[attributes["id"]] = {"kinds": attributes["data-events"].split(), "rows": [],
                                            **{k: v for k, v in attributes.items() if k.startswith("data-")}}
            self._open.append((attributes["id"], self._depth))
        if tag not in _VOID:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        self._depth -= 1
        if self._open and self._open[-1][1] == self._depth:
            self._open.pop()


def _followers(page: str) -> dict[str, dict[str, Any]]:
    parser = _Followers()
    parser.feed(page)
    return parser.found


async def _edit(client: httpx.AsyncClient, token: str, path: str, body: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    current = await client.get(path, headers=auth)
    answer = await client.patch(f"{path}/ratings/sha1", json=body,
                                headers={**auth, "If-Match": current.headers["etag"]})
    assert answer.status_code == 200, answer.text


async def test_every_page_of_changing_data_names_its_events_and_its_rows_have_ids(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("root", ["admin"]))
    expected = {
        "/ui/tables": ("table-list", ["rating_table.revision", "rating_table.deleted"], None, "/ui/tables"),
        "/ui/tables/esaf-2006": ("grid-rows", ["rating_table.revision", "rating_table.deleted"], "esaf-2006",
                                 "/ui/tables/esaf-2006"),
        "/ui/tables/esaf-2006/revisions": ("revision-list", ["rating_table.revision", "rating_table.deleted"],
                                           "esaf-2006", "/ui/tables/esaf-2006/revisions"),
        "/ui/policies": ("policy-rows", ["policy.revision", "policy.deleted"], None, "/ui/policies"),
        "/ui/policies/voip/revisions": ("revision-list", ["policy.revision", "policy.deleted"], "voip",
                                        "/ui/policies/voip/revisions"),
        "/ui/policies/voip": ("policy-live", ["policy.revision", "policy.deleted"], "voip",
                              "/ui/policies/voip/live?revision=1"),
        "/ui/audit": ("audit-rows", ["audit"], None, None),
        "/ui/tokens": ("token-rows", ["audit"], None, "/ui/tokens"),
        "/ui/gateways": ("gateway-rows", ["gateway.refreshed", "gateway.registered", "gateway.deleted"], None,
                         "/ui/gateways"),
    }
    for path, (ident, kinds, subject, source) in expected.items():
        followers = _followers((await client.get(path, headers=HTMX)).text)  # as live.js reads it again
        assert ident in followers, (path, followers)
        live = followers[ident]
        assert live["kinds"] == kinds, path
        assert live.get("data-subject") == subject, path
        assert live.get("data-source") == source, path
        assert None not in live["rows"], (path, live["rows"])  # every row merges by its id
    grid = _followers((await client.get("/ui/tables/esaf-2006")).text)["grid-rows"]
    assert grid["data-also"] == "table-revision"
    assert "row-sha1" in grid["rows"]


async def test_the_grid_read_again_holds_a_cell_saved_elsewhere_in_its_row(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    admin = token("root", ["admin"])
    await sign_in(client, admin)
    await _edit(client, token("colleague", ["ratings:write"]), "/v1/rating-tables/esaf-2006",
                {"integrity": 6, "reason": "seen live"})
    page = (await client.get("/ui/tables/esaf-2006", headers=HTMX)).text
    row = re.search(r'<tr id="row-sha1"[^>]*>(.*?)</tr>', page, re.DOTALL)
    assert row, page
    assert "seen live" in row.group(1)
    assert '<td class="num">6</td>' in row.group(1)
    assert '<span id="table-revision" class="muted">revision 2</span>' in page
    assert '"revision": 2' in row.group(1)  # its Edit opens on the revision it shows


async def test_the_policy_page_tells_of_a_change_elsewhere_and_keeps_its_form(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    admin = token("root", ["admin"])
    await sign_in(client, admin)
    quiet = await client.get("/ui/policies/voip/live?revision=1", headers=HTMX)
    assert quiet.status_code == 200
    assert re.fullmatch(r'\s*<div id="policy-live">\s*</div>\s*', quiet.text), quiet.text
    auth = {"Authorization": f"Bearer {token('colleague', ['policies:write'])}"}
    current = await client.get("/v1/policies/voip", headers=auth)
    saved = await client.put("/v1/policies/voip", json={**current.json()["policy"], "description": "theirs"},
                             headers={**auth, "If-Match": current.headers["etag"]})
    assert saved.status_code == 200, saved.text
    told = html.unescape(re.sub(r"<[^>]+>|\s+", " ", (await client.get("/ui/policies/voip/live?revision=1")).text))
    assert "voip changed elsewhere: revision 2 was saved" in told
    assert "by colleague; this page shows revision 1" in told
    assert "What you typed is kept: saving it shows both side by side first." in told
    assert "<form" not in (await client.get("/ui/policies/voip/live?revision=2")).text
    assert "changed elsewhere" not in (await client.get("/ui/policies/voip/live?revision=2")).text
    assert (await client.delete("/v1/policies/voip", headers={"Authorization": f"Bearer {admin}"})).status_code == 204
    gone = (await client.get("/ui/policies/voip/live?revision=2")).text
    assert "voip was deleted elsewhere." in gone


async def test_the_event_stream_opens_only_for_a_live_session(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    nobody = await client.get("/ui/events")
    assert (nobody.status_code, nobody.headers["location"]) == (303, "/ui/login")
    csrf = await sign_in(client, token("reader", ["tunnels:read"]))
    cookie = client.cookies["qoss_session"]
    assert (await client.post("/ui/logout", data={"csrf": csrf})).status_code == 303
    kept = browser()  # a browser that kept the cookie of the ended session
    kept.cookies.set("qoss_session", cookie)
    stale = await kept.get("/ui/events")
    assert stale.status_code == 303
    assert not stale.headers.get("content-type", "").startswith("text/event-stream")


async def test_signing_out_ends_an_open_stream(app: Any, token: Callable[..., str]) -> None:
    async with client_of(app) as reader:
        csrf = await sign_in(reader, token("reader", ["tunnels:read"]))
        streaming = asyncio.create_task(reader.get("/ui/events", timeout=20))  # the body ends with the stream
        await asyncio.sleep(0.8)
        assert not streaming.done()
        assert (await reader.post("/ui/logout", data={"csrf": csrf})).status_code == 303
        ended = await asyncio.wait_for(streaming, 5)
    assert ended.headers["content-type"].startswith("text/event-stream")
    assert ended.text.rstrip().endswith(": stream ended: the console session has ended")
