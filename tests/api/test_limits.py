"""Input limits: body cap (413) however the body is sent, list and string caps, unknown fields rejected."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from app.web.deps import MAX_DB_INT

pytestmark = pytest.mark.anyio

CAP = 65536  # max_body_bytes of the api tests' settings


async def chunks(total: int, size: int = 8192) -> AsyncIterator[bytes]:
    """A JSON body sent without Content-Length (chunked transfer)."""
    yield b'{"peers": [{"name": "a"}], "pad": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


@pytest.mark.parametrize("path", ["/v1/negotiations", "/v1/policies", "/v1/rating-tables/import?format=yaml"])
async def test_a_chunked_body_over_the_cap_is_413(client: httpx.AsyncClient, path: str) -> None:
    r = await client.post(path, content=chunks(CAP * 2), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json() == {"error": "PayloadTooLarge", "detail": f"request bodies are limited to {CAP} bytes"}


async def test_a_chunked_body_under_the_cap_is_read(client: httpx.AsyncClient) -> None:
    async def small() -> AsyncIterator[bytes]:
        yield json.dumps({"peers": [{"name": "a", "min_levels": {"integrity": 4}}]}).encode()

    r = await client.post("/v1/negotiations", content=small(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_a_lying_content_length_does_not_lift_the_cap(client: httpx.AsyncClient) -> None:
    body = b'{"peers": [{"name": "a"}], "pad": "' + b"x" * (CAP * 2) + b'"}'
    r = await client.post("/v1/negotiations", content=body,
                          headers={"content-type": "application/json", "content-length": "100"})
    assert r.status_code in (413, 422), r.text  # never read past the cap, never a 200 or a 500


async def test_oversized_bodies_are_audited(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/policies", content=chunks(CAP * 2), headers={"content-type": "application/json",
                                                                           "x-request-id": "too-big-1"})
    assert r.status_code == 413
    records = (await client.get("/v1/audit", params={"limit": 1000})).json()
    (record,) = [x for x in records if x["client_request_id"] == "too-big-1"]
    assert record["outcome"] == 413
    assert record["detail"] == "PayloadTooLarge"


async def test_an_over_long_authorization_header_is_401(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/policies", json={"name": "x"}, headers={"Authorization": "Bearer " + "A" * 8000})
    assert r.status_code == 401
    assert r.json() == {"error": "Unauthenticated", "detail": "a valid API token is required"}


# ----------------------------------------------------------------------------- schema walk

def _schemas(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = create_app(settings).openapi()
    return doc, doc.get("components", {}).get("schemas", {})


def _walk(node: Any, components: dict[str, Any], where: str, seen: set[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema reachable from ``node`` (following $ref once each), with where it is."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            yield from _walk(components[name], components, name, seen)
        return
    yield where, node
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], components, f"{where}[]", seen)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for sub in node.get(key, []):
            yield from _walk(sub, components, where, seen)
    for prop, sub in node.get("properties", {}).items():
        yield from _walk(sub, components, f"{where}.{prop}", seen)


def request_schemas(settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    """(where, schema) of every schema a request body or a path or query parameter may carry.

    Headers are left out: the HTTP server caps their size, and an over-long
    ``Authorization`` is a 401 like any other malformed one (tested below).
    """
    doc, components = _schemas(settings)
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            label = f"{method.upper()} {path}"
            for content in op.get("requestBody", {}).get("content", {}).values():
                out += list(_walk(content.get("schema", {}), components, label, set()))
            for param in (p for p in op.get("parameters", []) if p["in"] != "header"):
                out += [(f"{label} {param['name']}", s) for _, s in _walk(param["schema"], components, "", set())]
    return out


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_every_request_string_number_list_and_map_is_capped(settings: Settings) -> None:
    uncapped = []
    for where, schema in request_schemas(settings):
        kind = schema.get("type")
        bounded_pattern = "pattern" in schema and not any(c in schema["pattern"] for c in "*+")
        if kind == "string" and not ({"maxLength", "enum", "const"} & set(schema) or bounded_pattern):
            uncapped.append(f"{where}: string without maxLength")
        if kind == "array" and "maxItems" not in schema:
            uncapped.append(f"{where}: array without maxItems")
        if kind in ("integer", "number") and not {"maximum", "exclusiveMaximum"} & set(schema):
            uncapped.append(f"{where}: number without maximum")
        if kind == "integer" and schema.get("maximum", 0) > MAX_DB_INT:
            uncapped.append(f"{where}: integer past the database's INTEGER")
        if kind == "object" and isinstance(schema.get("additionalProperties"), dict) and "maxProperties" not in schema:
            uncapped.append(f"{where}: map without maxProperties")
    assert uncapped == []


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_every_request_object_rejects_unknown_fields(settings: Settings) -> None:
    open_objects = [where for where, schema in request_schemas(settings)
                    if schema.get("type") == "object" and "properties" in schema
                    and schema.get("additionalProperties") is not False]
    assert open_objects == []


# ----------------------------------------------------------------------------- keywords

#: Strings that are no catalogue keyword, some shaped to break out of a VICI proposal.
NOT_KEYWORDS = ["aes128;evil", "aes128-sha1", "aes128\n}", "default", "", "aes128{", "%s", "aes128 sha1",
                "aes128,sha1", "x" * 64]


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("bad", NOT_KEYWORDS, ids=range(len(NOT_KEYWORDS)))
async def test_keywords_come_only_from_the_catalogue(client: httpx.AsyncClient, bad: str) -> None:
    etag = (await client.get("/v1/rating-tables/standards-2026")).headers["etag"]
    answers = {
        "negotiation supports": await client.post("/v1/negotiations", json={
            "peers": [{"name": "a", "supports": [bad, "sha1"]}]}),
        "policy allow": await client.post("/v1/policies", json={"name": "kw-a", "allow": [bad]}),
        "policy deny": await client.post("/v1/policies", json={"name": "kw-d", "deny": [bad]}),
        "rating row": await client.post("/v1/rating-tables", json={
            "name": "kw", "ratings": [{"algorithm": bad, "confidentiality": 1, "performance": 1}]}),
        "rating edit": await client.patch(f"/v1/rating-tables/standards-2026/ratings/{quote(bad, safe='')}",
                                          json={"confidentiality": 1}, headers={"If-Match": etag}),
        "tunnel supports": await client.post("/v1/tunnels", json={
            "initiator": "a", "responder": "b", "supports": [bad]}),
    }
    for where, r in answers.items():
        assert r.status_code in (404, 422), (where, r.status_code, r.text)
    assert (await client.get("/v1/policies/kw-a")).status_code == 404
    assert (await client.get("/v1/rating-tables/kw")).status_code == 404


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_keyword_is_stored_as_the_catalogue_spells_it(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/policies", json={"name": "kw", "allow": ["AES128", " aes256 "]})
    assert r.status_code == 201, r.text
    assert (await client.get("/v1/policies/kw")).json()["policy"]["allow"] == ["aes128", "aes256"]


# ----------------------------------------------------------------------------- text PostgreSQL cannot store

ROW = '{"algorithm": "aes128", "confidentiality": 8, "performance": 8%s}'
UNSTORABLE = {
    "policy description": ("POST", "/v1/policies", '{"name": "nul", "description": "a%sb"}'),
    "table description": ("POST", "/v1/rating-tables", '{"name": "nul", "description": "a%sb", "ratings": [' +
                          ROW % "" + "]}"),
    "row reason": ("POST", "/v1/rating-tables", '{"name": "nul", "ratings": [' + ROW % ', "reason": "a%sb"' + "]}"),
    "row source": ("POST", "/v1/rating-tables", '{"name": "nul", "ratings": [' + ROW % ', "source": "a%sb"' + "]}"),
    "measurement": ("POST", "/v1/rating-tables", '{"name": "nul", "ratings": [' +
                    ROW % ', "measurement": {"machine": "a%sb"}' + "]}"),
    "csv import": ("POST", "/v1/rating-tables/import?format=csv&name=nul",
                   "algorithm,confidentiality,performance,source\naes128,8,8,a%sb\n"),
    "yaml import": ("POST", "/v1/rating-tables/import?format=yaml",
                    "name: nul\nratings:\n- {algorithm: aes128, confidentiality: 8, performance: 8, source: a%sb}\n"),
}


@pytest.mark.parametrize("char", ["\\u0000", "\\ud800"], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize("where", list(UNSTORABLE))
async def test_text_the_database_cannot_store_is_422_not_500(client: httpx.AsyncClient, where: str,
                                                            char: str) -> None:
    method, path, template = UNSTORABLE[where]
    if path.endswith(("csv&name=nul", "yaml")):  # text bodies carry the character itself
        body, kind = (template % char.encode().decode("unicode_escape")).encode("utf-8", "surrogatepass"), "text/plain"
    else:
        body, kind = (template % char).encode(), "application/json"
    r = await client.request(method, path, content=body, headers={"content-type": kind})
    assert r.status_code == 422, (where, r.status_code, r.text)
    assert (await client.get("/v1/policies/nul")).status_code == 404
    assert (await client.get("/v1/rating-tables/nul")).status_code == 404


# ----------------------------------------------------------------------------- numbers PostgreSQL cannot hold

BIG = f'"{MAX_DB_INT + 1}"'


async def test_an_if_match_past_any_revision_is_428_not_500(client: httpx.AsyncClient) -> None:
    rows = [{"algorithm": "aes128", "confidentiality": 8, "performance": 8}]
    assert (await client.post("/v1/policies", json={"name": "big"})).status_code == 201
    answers = [
        await client.put("/v1/rating-tables/esaf-2006", json={"name": "esaf-2006", "ratings": rows},
                         headers={"If-Match": BIG}),
        await client.patch("/v1/rating-tables/esaf-2006/ratings/aes128", json={"performance": 1},
                           headers={"If-Match": BIG}),
        await client.put("/v1/policies/big", json={"name": "big"}, headers={"If-Match": BIG}),
    ]
    assert [r.status_code for r in answers] == [428, 428, 428], [r.text for r in answers]
    assert (await client.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 1


async def test_audit_paging_past_any_id_is_422_not_500(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/audit", params={"before": MAX_DB_INT})).status_code == 200
    assert (await client.get("/v1/audit", params={"before": MAX_DB_INT + 1})).status_code == 422


# ----------------------------------------------------------------------------- YAML bombs

def _laughs(levels: int) -> str:
    """The "billion laughs": each line an anchored list of nine aliases of the line before."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


ROW_YAML = "- {algorithm: aes128, confidentiality: 8, performance: 8%s}\n"
#: Seven levels (9**7 leaves) are enough to tell; each further line multiplies by nine.
BOMBS = {
    "aliases as the ratings": (_laughs(7) + "name: bomb\nratings: *l6\n", "aliases"),
    "aliases in a description": (_laughs(7) + "name: bomb\ndescription: *l6\nratings:\n" + ROW_YAML % "", "aliases"),
    "aliases in a row": (_laughs(7) + "name: bomb\nratings:\n" + ROW_YAML % ", measurement: {machine: *l6}",
                         "aliases"),
    "deep nesting": ("name: bomb\nratings: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper"),
}


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("bomb", list(BOMBS))
async def test_yaml_bombs_are_refused_before_anything_is_built(client: httpx.AsyncClient, bomb: str) -> None:
    document, reason = BOMBS[bomb]
    r = await client.post("/v1/rating-tables/import", content=document, headers={"content-type": "text/plain"})
    assert r.status_code == 422, r.text
    assert reason in r.json()["detail"]
    assert (await client.get("/v1/rating-tables/bomb")).status_code == 404
