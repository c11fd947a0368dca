"""Policies through the API."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.anyio

VOIP = {"name": "my-voip", "min_levels": {"confidentiality": 6, "integrity": 5}, "objective_id": 3,
        "traffic": {"packet_size": 160}}


async def test_shipped_policies_are_listed(client: httpx.AsyncClient) -> None:
    names = {p["name"] for p in (await client.get("/v1/policies")).json()}
    assert {"voip", "bulk-backup", "mobile-default"} <= names


async def test_policy_crud_with_revisions(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/policies", json=VOIP, headers={"X-Qoss-Actor": "carol"})
    assert r.status_code == 201, r.text
    assert r.headers["etag"] == '"1"'
    assert r.json()["policy"]["objectives"] == sorted(
        ["O.Comm_Trusted_Channel", "O.Data_Exchange_Conf", "O.Crypto_Comm_Channel"])
    r = await client.put("/v1/policies/my-voip", json={**VOIP, "pfs": False}, headers={"If-Match": '"1"'})
    assert r.status_code == 200
    assert r.json()["revision"] == 2
    # Made on revision 1, after revision 2: what it changes lands over theirs, field by field.
    r = await client.put("/v1/policies/my-voip", json=VOIP, headers={"If-Match": '"1"'})
    assert (r.status_code, r.json()["revision"]) == (200, 2)  # it changes nothing of theirs: revision 2
    stronger = {**VOIP, "min_levels": {"confidentiality": 6, "integrity": 7}}
    r = await client.put("/v1/policies/my-voip", json=stronger, headers={"If-Match": '"1"'})
    assert (r.status_code, r.json()["revision"]) == (200, 3)
    assert (r.json()["policy"]["pfs"], r.json()["policy"]["min_levels"]["integrity"]) == (False, 7)
    history = (await client.get("/v1/policies/my-voip/revisions")).json()
    assert history[-1]["message"] == "replaced (made on revision 1, merged)"
    clash = {**VOIP, "min_levels": {"confidentiality": 6, "integrity": 9}}
    r = await client.put("/v1/policies/my-voip", json=clash, headers={"If-Match": '"2"'})
    assert r.status_code == 409
    assert r.json()["error"] == "EditConflict"
    assert (r.json()["detail"]["policy"], r.json()["detail"]["revision"]) == ("my-voip", 3)
    assert r.json()["detail"]["conflicts"] == [{"algorithm": None, "field": "min_levels.integrity", "base": 5,
                                                "theirs": 7, "mine": 9}]
    assert "min_levels.integrity is 7 at revision 3, yours is 9" in r.json()["detail"]["message"]
    assert (await client.get("/v1/policies/my-voip")).json()["revision"] == 3
    assert (await client.put("/v1/policies/my-voip", json=VOIP, headers={"If-Match": '"9"'})).status_code == 409
    assert (await client.get("/v1/policies/my-voip")).json()["policy"]["pfs"] is False
    assert (await client.delete("/v1/policies/my-voip")).status_code == 204
    assert (await client.get("/v1/policies/my-voip")).status_code == 404


@pytest.mark.parametrize(
    "bad",
    [
        {**VOIP, "deny": ["rot13"]},
        {**VOIP, "objectives": ["O.Teleport"]},
        {**VOIP, "min_levels": {"integrity": -1}},
        {**VOIP, "mode": "sideways"},
        {**VOIP, "extra": True},
    ],
)
async def test_invalid_policy_is_422_and_not_stored(client: httpx.AsyncClient, bad: dict[str, object]) -> None:
    r = await client.post("/v1/policies", json=bad)
    assert r.status_code == 422
    assert (await client.get("/v1/policies/my-voip")).status_code == 404


async def test_negotiation_with_stored_policy(client: httpx.AsyncClient) -> None:
    await client.post("/v1/policies", json=VOIP)
    r = await client.post("/v1/negotiations", json={"peers": [{"name": "phone", "policy": "my-voip"}]})
    assert r.status_code == 200, r.text
    assert r.json()["levels"]["confidentiality"] >= 6


async def test_policy_revert_restores_an_old_revision(client: httpx.AsyncClient) -> None:
    first = (await client.get("/v1/policies/voip")).json()
    r = await client.put("/v1/policies/voip", json={**first["policy"], "description": "changed"},
                         headers={"If-Match": f'"{first["revision"]}"'})
    assert r.status_code == 200, r.text
    current = r.json()["revision"]
    r = await client.post("/v1/policies/voip/revert", json={"revision": first["revision"]},
                          headers={"If-Match": f'"{current}"'})
    assert r.status_code == 200, r.text
    assert r.json()["revision"] == current + 1
    assert r.json()["policy"] == first["policy"]
    history = (await client.get("/v1/policies/voip/revisions")).json()
    assert history[-1]["message"] == f"reverted to {first['revision']}"
    again = await client.post("/v1/policies/voip/revert", json={"revision": first["revision"]},
                              headers={"If-Match": f'"{current}"'})
    assert again.status_code == 409
