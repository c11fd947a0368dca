"""``GET /v1/audit`` as JSON lines: the hash chain's export for a SIEM, with the audit log's own scope."""

from __future__ import annotations

import json

import httpx
import pytest

from app.adapters.audit_seal import AuditSeal
from app.domain.audit_chain import entry_hash, verify
from app.settings import Settings
from tests.api.conftest import make_token

pytestmark = pytest.mark.anyio


async def changes(client: httpx.AsyncClient, n: int) -> None:
    for i in range(n):
        r = await client.post("/v1/tokens", json={"name": f"siem-{i}", "scopes": ["tunnels:read"]})
        assert r.status_code == 201, r.text


async def test_jsonl_is_the_chain_oldest_first(client: httpx.AsyncClient) -> None:
    await changes(client, 3)
    r = await client.get("/v1/audit", params={"format": "jsonl", "limit": 1000})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    entries = [json.loads(line) for line in r.text.splitlines()]
    assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
    assert {e["request_id"] for e in entries} >= {x["request_id"] for x in (await client.get("/v1/audit")).json()
                                                  if x["object"] == "/v1/tokens"}
    key = AuditSeal.from_settings(Settings()).read_key()  # kept outside the database; a SIEM is given it
    assert all(entry_hash(e, key) == e["hash"] for e in entries)
    assert verify(entries, key=key).intact  # from the first entry on


async def test_accept_ndjson_and_since_page_through_it(client: httpx.AsyncClient) -> None:
    await changes(client, 4)
    whole = (await client.get("/v1/audit", params={"format": "jsonl", "limit": 1000})).text.splitlines()
    pages: list[str] = []
    since = 0
    while True:
        r = await client.get("/v1/audit", params={"since": since, "limit": 2},
                             headers={"Accept": "application/x-ndjson"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = r.text.splitlines()
        if not lines:
            break
        pages += lines
        since = json.loads(lines[-1])["id"]
    assert pages[:len(whole)] == whole


async def test_json_is_still_the_default(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/audit")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert isinstance(r.json(), list)


async def test_jsonl_needs_the_audit_scope(client: httpx.AsyncClient, settings: Settings) -> None:
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    r = await client.get("/v1/audit", params={"format": "jsonl"}, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403
    auditor = make_token(settings.database_url, "auditor", ["audit:read"])
    r = await client.get("/v1/audit", params={"format": "jsonl"}, headers={"Authorization": f"Bearer {auditor}"})
    assert r.status_code == 200
