"""A dry run of an edit is audited as what it is: its record says that nothing was kept, a real
edit's does not."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio

ROW = "/v1/rating-tables/esaf-2006/ratings/sha1"


async def _record(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    r = await client.get("/v1/audit", params={"limit": 1000})
    assert r.status_code == 200, r.text
    found = [a for a in r.json() if a["request_id"] == request_id]
    assert len(found) == 1, found
    return dict(found[0])


async def test_a_dry_run_patch_is_audited_as_a_dry_run_and_a_real_one_is_not(client: httpx.AsyncClient) -> None:
    dry = await client.patch(ROW, params={"dry_run": "true"}, json={"integrity": 6}, headers={"If-Match": '"1"'})
    assert dry.status_code == 200, dry.text
    assert dry.json()["dry_run"] is True
    real = await client.patch(ROW, json={"integrity": 6}, headers={"If-Match": '"1"'})
    assert real.status_code == 200, real.text
    dry_record = await _record(client, dry.headers["x-request-id"])
    real_record = await _record(client, real.headers["x-request-id"])
    assert (dry_record["action"], dry_record["outcome"]) == (real_record["action"], real_record["outcome"]) == (
        "PATCH", 200)
    assert dry_record["detail"] == "dry run: nothing saved"
    assert "dry run" not in real_record["detail"]


async def test_every_dry_run_edit_says_so(client: httpx.AsyncClient) -> None:
    """A table replaced and a policy replaced, each as a dry run."""
    table = (await client.get("/v1/rating-tables/esaf-2006")).json()
    put = await client.put("/v1/rating-tables/esaf-2006", params={"dry_run": "true"}, headers={"If-Match": '"1"'},
                           json={k: table[k] for k in ("name", "ratings")})
    assert put.status_code == 200, put.text
    policy = await client.put("/v1/policies/voip", params={"dry_run": "true"}, headers={"If-Match": '"1"'},
                              json={"name": "voip"})
    assert policy.status_code == 200, policy.text
    for answer in (put, policy):
        assert (await _record(client, answer.headers["x-request-id"]))["detail"] == "dry run: nothing saved"
