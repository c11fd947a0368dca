"""POST /v1/negotiations with a post-quantum minimum: the mechanism chosen, none unasked, a refusal that
names the level and the end."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio

CLASSICAL = ["aes128", "aes256gcm16", "sha256", "x25519"]


async def negotiate(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/negotiations", json=body)


async def test_a_post_quantum_minimum_with_ppk_on_both_ends_chooses_it(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [
        {"name": "left", "supports": [*CLASSICAL, "ppk"]},
        {"name": "right", "supports": [*CLASSICAL, "ppk"], "min_levels": {"confidentiality": 8, "post_quantum": 6}},
    ]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["suite"]["post_quantum"] == "ppk"
    assert body["levels"]["post_quantum"] == 9
    assert body["requirement"]["right"]["post_quantum"] == 6


async def test_without_the_minimum_the_answer_has_no_mechanism(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "left", "supports": [*CLASSICAL, "ppk"],
                                            "min_levels": {"confidentiality": 8}}]})
    assert r.status_code == 200, r.text
    assert r.json()["suite"]["post_quantum"] is None
    assert r.json()["levels"]["post_quantum"] == 0


async def test_an_end_without_a_mechanism_is_409_naming_the_level(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [
        {"name": "left", "supports": [*CLASSICAL, "ppk"], "min_levels": {"post_quantum": 1}},
        {"name": "android", "supports": CLASSICAL},
    ]})
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["error"] == "NoFeasibleSuite"
    assert body["detail"]["unmet"] == [
        {"peer": "left", "requirement": "post_quantum", "level": 1, "best_available": None}]
    assert any("not supported by android" in n for n in body["detail"]["notes"])


@pytest.mark.parametrize("value", [11, -1, "5", 2.5])
async def test_a_bad_post_quantum_level_is_422(client: httpx.AsyncClient, value: object) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "min_levels": {"post_quantum": value}}]})
    assert r.status_code == 422, r.text
    assert "post_quantum" in r.text


async def test_a_table_rates_the_mechanisms_like_any_algorithm(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/rating-tables", json={"name": "pq-strict", "ratings": [
        {"algorithm": "ppk", "post_quantum": 4, "performance": 6, "reason": "test: distribution not trusted"}]})
    assert r.status_code == 201, r.text
    body = {"rating_table": "pq-strict", "peers": [{"name": "left", "supports": [*CLASSICAL, "ppk"],
                                                    "min_levels": {"post_quantum": 5}}]}
    refused = await negotiate(client, body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"]["unmet"] == [
        {"peer": "left", "requirement": "post_quantum", "level": 5, "best_available": 4}]
    etag = (await client.get("/v1/rating-tables/pq-strict")).headers["ETag"]
    r = await client.patch("/v1/rating-tables/pq-strict/ratings/ppk", json={"post_quantum": 9, "reason": "test"},
                           headers={"If-Match": etag})
    assert r.status_code == 200, r.text
    assert (await negotiate(client, body)).json()["suite"]["post_quantum"] == "ppk"
    r = await client.post("/v1/rating-tables", json={"name": "pq-wrong", "ratings": [
        {"algorithm": "aes128", "confidentiality": 8, "post_quantum": 9, "performance": 8}]})
    assert r.status_code == 422, r.text
    assert "no post_quantum level" in r.text
