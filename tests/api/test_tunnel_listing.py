"""``GET /v1/tunnels`` a page at a time: the Link header walks every tunnel once, oldest first,
whatever is torn down meanwhile; ``state`` filters; a cursor it never gave is a 422."""

from __future__ import annotations

import httpx
import pytest

from app.settings import Settings
from tests.fixtures.tunnel_records import add_tunnel_records, unit_on

pytestmark = pytest.mark.anyio


def _next(response: httpx.Response) -> str | None:
    link = response.headers.get("link")
    if link is None:
        return None
    target, rel = link.split(";")
    assert rel.strip() == 'rel="next"'
    return target.strip().removeprefix("<").removesuffix(">")


async def _walk(client: httpx.AsyncClient, first: str) -> tuple[list[dict[str, object]], int]:
    seen: list[dict[str, object]] = []
    pages = 0
    url: str | None = first
    while url is not None:
        r = await client.get(url)
        assert r.status_code == 200, r.text
        seen += r.json()
        pages += 1
        url = _next(r)
    return seen, pages


async def test_the_link_header_walks_every_tunnel_once_in_creation_order(
        client: httpx.AsyncClient, settings: Settings) -> None:
    ordered = add_tunnel_records(settings.database_url, 7)
    seen, pages = await _walk(client, "/v1/tunnels?limit=3")
    assert ([t["id"] for t in seen], pages) == (ordered, 3)
    down, pages = await _walk(client, "/v1/tunnels?limit=2&state=down")
    assert {t["state"] for t in down} == {"down"}
    assert ([t["id"] for t in down], pages) == ([i for n, i in enumerate(ordered) if n % 3 == 0], 2)
    everything = await client.get("/v1/tunnels")
    assert [t["id"] for t in everything.json()] == ordered
    assert "link" not in everything.headers


async def test_a_page_goes_on_after_the_tunnel_its_cursor_names_is_torn_down(
        client: httpx.AsyncClient, settings: Settings) -> None:
    ordered = add_tunnel_records(settings.database_url, 5)
    first = await client.get("/v1/tunnels?limit=2")
    url = _next(first)
    assert url is not None
    with unit_on(settings.database_url) as uow:
        uow.tunnels.delete(ordered[1])
        uow.commit()
    rest = await client.get(url)
    assert [t["id"] for t in rest.json()] == ordered[2:4]


@pytest.mark.parametrize("query", [
    "limit=0", "limit=1001", "state=sideways", "cursor=%21%21", "cursor=" + "A" * 201, "cursor=A",
    "cursor=bm90LWEtY3Vyc29y",  # "not-a-cursor"
    "cursor=MjAyNi0xMS0yNlQxMjowMDowMHx0MQ",  # a time without a zone
    "cursor=MDAwMS0wMS0wMVQwMDowMDowMCsxNDowMHx0MQ",  # a time before year 1 in UTC
    "cursor=OTk5OS0xMi0zMVQyMzo1OTo1OS0xNDowMHx0MQ",  # a time after year 9999 in UTC
])
async def test_a_bad_page_request_is_a_422_that_says_which_part(client: httpx.AsyncClient, query: str) -> None:
    r = await client.get(f"/v1/tunnels?{query}")
    assert r.status_code == 422, r.text
    assert query.partition("=")[0] in r.text
