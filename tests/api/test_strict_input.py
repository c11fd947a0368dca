"""Strict input: a key given twice, a level that is not an integer, a YAML number that is
not a plain decimal are refused (422) and named, never silently read one way or another."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from app.main import create_app
from app.settings import Settings

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}
ROW = {"algorithm": "aes128", "confidentiality": 8, "performance": 8}


def assert_refused(r: httpx.Response, *named: str) -> None:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] in ("ValidationError", "InvalidRatingTable", "InvalidPolicy"), body
    for word in named:
        assert word in json.dumps(body["detail"]), (word, body)


async def make_table(client: httpx.AsyncClient, name: str) -> None:
    r = await client.post("/v1/rating-tables", json={"name": name, "ratings": [ROW]})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(("path", "raw", "key"), [
    ("/v1/policies", '{"name": "dup", "name": "other"}', "name"),
    ("/v1/policies", '{"name": "dup", "min_levels": {"integrity": 8, "integrity": 1}}', "integrity"),
    ("/v1/negotiations", '{"peers": [{"name": "a", "min_levels": {"integrity": 8, "integrity": 1}}]}', "integrity"),
    ("/v1/rating-tables", '{"name": "dup", "ratings": [{"algorithm": "aes128", "confidentiality": 8, '
                          '"performance": 8, "performance": 1}]}', "performance"),
    ("/v1/tokens", '{"name": "a", "scopes": ["admin"], "scopes": ["tunnels:read"]}', "scopes"),
])
async def test_a_json_key_given_twice_is_refused_and_named(
        client: httpx.AsyncClient, path: str, raw: str, key: str) -> None:
    r = await client.post(path, content=raw, headers=JSON)
    assert_refused(r, "duplicate", f"'{key}'")


async def test_a_rating_edit_with_a_key_twice_changes_nothing(client: httpx.AsyncClient) -> None:
    await make_table(client, "dup-edit")
    r = await client.patch("/v1/rating-tables/dup-edit/ratings/aes128", content='{"confidentiality": 8, '
                           '"confidentiality": 1}', headers={**JSON, "If-Match": '"1"'})
    assert_refused(r, "'confidentiality'")
    table = (await client.get("/v1/rating-tables/dup-edit")).json()
    assert (table["revision"], table["ratings"][0]["confidentiality"]) == (1, 8)


async def test_the_agent_message_routes_refuse_a_key_twice(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/agent/requests", content='{"message": "a", "message": "b"}', headers=JSON)
    assert_refused(r, "'message'")


@pytest.mark.parametrize("level", [True, False, "8", 8.0, "eight"])
async def test_a_level_is_an_integer_not_a_boolean_or_a_string(client: httpx.AsyncClient, level: object) -> None:
    await make_table(client, "levels")
    r = await client.patch("/v1/rating-tables/levels/ratings/aes128", json={"confidentiality": level},
                           headers={"If-Match": '"1"'})
    assert_refused(r, "confidentiality")
    r = await client.post("/v1/rating-tables", json={"name": "lv", "ratings": [{**ROW, "confidentiality": level}]})
    assert_refused(r, "confidentiality")
    r = await client.post("/v1/policies", json={"name": "lv", "min_levels": {"integrity": level}})
    assert_refused(r, "integrity")
    r = await client.post("/v1/negotiations", json={"peers": [{"name": "a", "min_levels": {"integrity": level}}]})
    assert_refused(r, "integrity")
    assert (await client.get("/v1/rating-tables/levels")).json()["revision"] == 1
    assert (await client.get("/v1/policies/lv")).status_code == 404


async def test_other_numbers_and_flags_are_strict_too(client: httpx.AsyncClient) -> None:
    for body, field in (({"name": "f", "pfs": "yes"}, "pfs"), ({"name": "f", "objective_id": True}, "objective_id"),
                        ({"name": "f", "ike_lifetime": "3600"}, "ike_lifetime"),
                        ({"name": "f", "traffic": {"packet_size": "1400"}}, "packet_size")):
        assert_refused(await client.post("/v1/policies", json=body), field)
    r = await client.post("/v1/rating-tables", json={"name": "p", "ratings": [{**ROW, "performance": True}]})
    assert_refused(r, "performance")


YAML_TABLE = """name: {name}
ratings:
  - algorithm: aes128
    confidentiality: {level}
    performance: 8
"""


@pytest.mark.parametrize("level", ["1_0", "0x10", "010", "0o10", "0b1", "1e1", "1:30", "+0x1"])
async def test_a_yaml_level_that_is_not_a_plain_decimal_is_refused(client: httpx.AsyncClient, level: str) -> None:
    r = await client.post("/v1/rating-tables/import", content=YAML_TABLE.format(name="y", level=level),
                          headers={"content-type": "text/plain"})
    assert_refused(r, "confidentiality")
    assert (await client.get("/v1/rating-tables/y")).status_code == 404


async def test_a_yaml_key_given_twice_is_refused_and_named(client: httpx.AsyncClient) -> None:
    text = "name: y\nratings:\n  - algorithm: aes128\n    confidentiality: 8\n    confidentiality: 1\n" \
           "    performance: 8\n"
    r = await client.post("/v1/rating-tables/import", content=text, headers={"content-type": "text/plain"})
    assert_refused(r, "'confidentiality'", "line 5")
    r = await client.post("/v1/rating-tables/import", content="name: a\nname: b\nratings: []\n",
                          headers={"content-type": "text/plain"})
    assert_refused(r, "'name'")


async def test_plain_decimals_still_import(client: httpx.AsyncClient) -> None:
    text = YAML_TABLE.format(name="plain", level="10").replace("performance: 8", "performance: 7.5")
    r = await client.post("/v1/rating-tables/import", content=text, headers={"content-type": "text/plain"})
    assert r.status_code == 201, r.text
    assert r.json()["ratings"][0] == {"algorithm": "aes128", "confidentiality": 10, "performance": 7.5}


def test_every_route_parses_json_with_every_key_once(settings: Settings) -> None:
    from app.web.routing import QossRoute

    def api_routes(routes: list[Any]) -> list[APIRoute]:
        found: list[APIRoute] = []
        for route in routes:
            included = getattr(route, "original_router", None)  # an included router's routes
            found += api_routes(included.routes) if included is not None else (
                [route] if isinstance(route, APIRoute) else [])
        return found

    routes = api_routes(create_app(settings).router.routes)
    assert len(routes) > 30
    assert [r.path for r in routes if not isinstance(r, QossRoute)] == []
