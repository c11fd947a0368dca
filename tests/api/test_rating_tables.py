"""Rating tables through the API: revisions, If-Match, history, import/export."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.figures import tally

pytestmark = pytest.mark.anyio

SMALL = {
    "name": "lab-small",
    "description": "a test table",
    "source": "tests",
    "ratings": [
        {"algorithm": "aes128", "confidentiality": 8, "performance": 8},
        {"algorithm": "sha1", "integrity": 5, "performance": 6},
    ],
}


async def test_shipped_tables_are_listed(client: httpx.AsyncClient) -> None:
    names = {t["name"] for t in (await client.get("/v1/rating-tables")).json()}
    assert {"esaf-2006", "standards-2026"} <= names


async def test_get_table_has_etag_of_its_revision(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/rating-tables/esaf-2006")
    assert r.status_code == 200
    assert r.headers["etag"] == f'"{r.json()["revision"]}"'
    rows = {row["algorithm"]: row for row in r.json()["ratings"]}
    assert rows["3des"]["confidentiality"] == 8
    assert rows["3des"]["performance"] == 2


async def test_create_then_duplicate_is_409_and_writes_nothing(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/rating-tables", json=SMALL, headers={"X-Qoss-Actor": "alice"})
    assert r.status_code == 201, r.text
    assert r.json()["revision"] == 1
    r = await client.post("/v1/rating-tables", json={**SMALL, "description": "other"})
    assert r.status_code == 409
    assert r.json()["error"] == "AlreadyExists"
    assert (await client.get("/v1/rating-tables/lab-small")).json()["description"] == "a test table"


async def test_write_without_if_match_is_428(client: httpx.AsyncClient) -> None:
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 3})
    assert r.status_code == 428


async def test_stale_if_match_is_409_and_changes_nothing(client: httpx.AsyncClient) -> None:
    first = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 3},
                               headers={"If-Match": '"1"'})
    assert first.status_code == 200
    stale = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 1},
                               headers={"If-Match": '"1"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "EditConflict"  # the same field changed since, to another value
    assert stale.headers["etag"] == '"2"'
    rows = {x["algorithm"]: x for x in (await client.get("/v1/rating-tables/esaf-2006")).json()["ratings"]}
    assert rows["md5"]["integrity"] == 3


async def test_history_records_who_and_what(client: httpx.AsyncClient, settings: Settings) -> None:
    bob = make_token(settings.database_url, "bob", ["ratings:write"])
    await client.patch("/v1/rating-tables/esaf-2006/ratings/sha1", json={"performance": 7},
                       headers={"If-Match": '"1"', "X-Qoss-Actor": "mallory", "Authorization": f"Bearer {bob}"})
    history = (await client.get("/v1/rating-tables/esaf-2006/revisions")).json()
    assert [h["revision"] for h in history] == [1, 2]
    assert history[1]["author"] == "bob"  # the token's name; the X-Qoss-Actor header is not trusted
    assert {"algorithm": "sha1", "field": "performance", "old": 6.0, "new": 7.0} in history[1]["changes"]
    old = (await client.get("/v1/rating-tables/esaf-2006/revisions/1")).json()
    assert {x["algorithm"]: x for x in old["ratings"]}["sha1"]["performance"] == 6


async def test_invalid_rating_edit_is_422_and_keeps_revision(client: httpx.AsyncClient) -> None:
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"confidentiality": 3},
                           headers={"If-Match": '"1"'})
    assert r.status_code == 422
    assert (await client.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 1


async def test_twenty_concurrent_edits_one_wins(client: httpx.AsyncClient, db_backend: str) -> None:
    async def edit(i: int) -> int:
        r = await client.patch("/v1/rating-tables/esaf-2006/ratings/aes128", json={"performance": 1 + i / 10},
                               headers={"If-Match": '"1"'})
        return r.status_code

    codes = await asyncio.gather(*(edit(i) for i in range(20)))
    assert sorted(codes) == [200] + [409] * 19
    assert (await client.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 2
    tally(f"concurrent edits of one rating row through the API ({db_backend}; 1 winner each 20)", 20)


@pytest.mark.parametrize("fmt", ["yaml", "csv"])
async def test_export_then_import_round_trips(client: httpx.AsyncClient, fmt: str) -> None:
    exported = await client.get("/v1/rating-tables/standards-2026/export", params={"format": fmt})
    assert exported.status_code == 200
    text = exported.text
    if fmt == "yaml":
        text = text.replace("name: standards-2026", "name: copy-of-standards", 1)
    r = await client.post("/v1/rating-tables/import", params={"format": fmt, "name": "copy-of-standards"},
                          content=text, headers={"content-type": "text/plain"})
    assert r.status_code == 201, r.text
    original = (await client.get("/v1/rating-tables/standards-2026")).json()["ratings"]
    copy = (await client.get("/v1/rating-tables/copy-of-standards")).json()["ratings"]
    assert copy == original


async def test_import_garbage_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/rating-tables/import", params={"format": "yaml"}, content="ratings: [",
                          headers={"content-type": "text/plain"})
    assert r.status_code == 422


async def test_default_table_cannot_be_deleted(client: httpx.AsyncClient) -> None:
    assert (await client.delete("/v1/rating-tables/standards-2026")).status_code == 409
    await client.post("/v1/rating-tables", json=SMALL)
    assert (await client.delete("/v1/rating-tables/lab-small")).status_code == 204
    assert (await client.get("/v1/rating-tables/lab-small")).status_code == 404


async def test_algorithms_catalogue(client: httpx.AsyncClient) -> None:
    listed = (await client.get("/v1/algorithms", params={"kind": "key_exchange"})).json()
    assert "modp2048" in {a["keyword"] for a in listed}
    assert (await client.get("/v1/algorithms/aes128gcm128")).json()["keyword"] == "aes128gcm16"
    missing = await client.get("/v1/algorithms/aes129")
    assert missing.status_code == 404
    assert "aes128" in missing.text


async def test_healthz(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.json()["status"] == "ok"


# ----------------------------------------------------------------------------- revert


async def _edit_md5(client: httpx.AsyncClient, integrity: int, revision: int) -> None:
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": integrity},
                           headers={"If-Match": f'"{revision}"'})
    assert r.status_code == 200, r.text


async def test_revert_writes_a_new_revision_with_the_old_content(client: httpx.AsyncClient) -> None:
    original = (await client.get("/v1/rating-tables/esaf-2006")).json()
    await _edit_md5(client, 3, 1)
    await _edit_md5(client, 1, 2)
    r = await client.post("/v1/rating-tables/esaf-2006/revert", json={"revision": 1, "message": "bad edits"},
                          headers={"If-Match": '"3"'})
    assert r.status_code == 200, r.text
    assert r.json()["revision"] == 4
    assert r.headers["etag"] == '"4"'
    assert r.json()["ratings"] == original["ratings"]
    assert (await client.get("/v1/rating-tables/esaf-2006")).json()["ratings"] == original["ratings"]
    history = (await client.get("/v1/rating-tables/esaf-2006/revisions")).json()
    assert [h["revision"] for h in history] == [1, 2, 3, 4]
    assert history[3]["message"] == "reverted to 1: bad edits"
    md5 = {r["algorithm"]: r for r in original["ratings"]}["md5"]["integrity"]
    assert {"algorithm": "md5", "field": "integrity", "old": 1, "new": md5} in history[3]["changes"]
    entries = [e for e in (await client.get("/v1/audit", params={"limit": 50})).json()
               if e["object"] == "/v1/rating-tables/esaf-2006/revert"]
    assert [e["outcome"] for e in entries] == [200]


async def test_revert_needs_the_current_revision_in_if_match(client: httpx.AsyncClient) -> None:
    await _edit_md5(client, 3, 1)
    missing = await client.post("/v1/rating-tables/esaf-2006/revert", json={"revision": 1})
    assert missing.status_code == 428
    stale = await client.post("/v1/rating-tables/esaf-2006/revert", json={"revision": 1}, headers={"If-Match": '"1"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "StaleRevision"
    assert (await client.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 2


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/rating-tables/esaf-2006/revert", {"revision": 7}, 404),        # no such revision
    ("/v1/rating-tables/nowhere/revert", {"revision": 1}, 404),          # no such table
    ("/v1/rating-tables/esaf-2006/revert", {"revision": 2}, 422),        # already the current revision
    ("/v1/rating-tables/esaf-2006/revert", {"revision": "1"}, 422),      # not an integer
    ("/v1/rating-tables/esaf-2006/revert", {"revision": 1, "x": 1}, 422),  # unknown field
])
async def test_revert_refusals_change_nothing(client: httpx.AsyncClient, path: str, body: dict[str, object],
                                              status: int) -> None:
    await _edit_md5(client, 3, 1)
    r = await client.post(path, json=body, headers={"If-Match": '"2"'})
    assert r.status_code == status, r.text
    assert [h["revision"] for h in (await client.get("/v1/rating-tables/esaf-2006/revisions")).json()] == [1, 2]


async def test_revert_needs_the_write_scope(client: httpx.AsyncClient, settings: Settings) -> None:
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    r = await client.post("/v1/rating-tables/esaf-2006/revert", json={"revision": 1},
                          headers={"If-Match": '"1"', "Authorization": f"Bearer {reader}"})
    assert r.status_code == 403


async def test_openapi_declares_the_bearer_scheme_and_required_if_match(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    revert = doc["paths"]["/v1/rating-tables/{name}/revert"]["post"]
    assert {"bearer": []} in revert["security"]
    (if_match,) = [p for p in revert["parameters"] if p["name"].lower() == "if-match"]
    assert if_match["required"] is True
    assert not [p for p in doc["paths"]["/v1/rating-tables"]["post"].get("parameters", [])
                if p["name"].lower() == "if-match"]


@pytest.mark.parametrize("etag", [b'"\xb2"', b"\xb9", b'"1\xb2"', b'"\xb3\xb3"'])
async def test_if_match_of_non_ascii_digits_is_428_not_a_crash(client: httpx.AsyncClient, etag: bytes) -> None:
    """Header bytes are read as Latin-1, where \xb2 is a superscript two: a digit to str.isdigit."""
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 3},
                           headers={"If-Match": etag})
    assert r.status_code == 428, r.text
