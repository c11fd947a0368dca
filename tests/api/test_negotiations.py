"""POST /v1/negotiations: the issue's contract, the worked examples, errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio


async def negotiate(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/negotiations", json=body)


async def test_min_integrity_4_picks_sha1(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"rating_table": "esaf-2006",
                                 "peers": [{"name": "app", "min_levels": {"integrity": 4}}]})
    assert r.status_code == 200, r.text
    assert r.json()["suite"]["integrity"] == "sha1"


async def test_min_confidentiality_8_integrity_4_picks_aes128_sha1(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"rating_table": "esaf-2006",
                                 "peers": [{"name": "app", "min_levels": {"confidentiality": 8, "integrity": 4}}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["suite"]["encryption"], body["suite"]["integrity"]) == ("aes128", "sha1")
    assert body["proposals"]["esp"].startswith("aes128-sha1")
    assert body["cost"] == pytest.approx(1 / 8 + 1 / 6, abs=1e-4)


async def test_min_integrity_9_is_409_naming_best_available_8(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"rating_table": "esaf-2006",
                                 "peers": [{"name": "app", "min_levels": {"integrity": 9}}]})
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "NoFeasibleSuite"
    assert body["detail"]["unmet"] == [
        {"peer": "app", "requirement": "integrity", "level": 9, "best_available": 8}
    ]


async def test_contract_example_two_peers(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {
        "rating_table": "esaf-2006",
        "peers": [
            {"name": "app", "min_levels": {"confidentiality": 8, "integrity": 4}},
            {"name": "gw", "min_levels": {"integrity": 5, "key_exchange": 6},
             "supports": ["aes128", "aes192", "sha1", "sha256", "modp2048"],
             "forbids": ["md5"], "objective_id": 3, "rating_table": "standards-2026"},
        ],
        "traffic": {"packet_size": 1400},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["suite"] == {"protocol": "esp", "encryption": "aes128", "integrity": "sha1",
                             "key_exchange": "modp2048", "aead": False, "post_quantum": None}
    assert body["proposals"] == {"esp": "aes128-sha1-modp2048", "ah": None, "ike": "aes128-sha256-modp2048"}
    assert body["levels"] == {"confidentiality": 8, "integrity": 5, "key_exchange": 6, "post_quantum": 0}
    assert body["cost"] == pytest.approx(0.29, abs=0.005)
    md5 = [x for x in body["rejected"] if x["algorithm"] == "md5"]
    assert md5
    assert md5[0]["peer"] == "gw"
    assert any("esaf-2006 rates no" in n for n in body["notes"])


async def test_contract_example_with_stored_policy_peer(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {
        "rating_table": "esaf-2006",
        "peers": [
            {"name": "app", "min_levels": {"confidentiality": 8, "integrity": 4}},
            {"name": "gw", "min_levels": {"integrity": 5, "key_exchange": 6},
             "supports": ["aes128", "aes192", "sha1", "sha256", "modp2048", "modp3072"],
             "forbids": ["md5"], "objective_id": 3, "rating_table": "standards-2026"},
            {"name": "branch", "policy": "bulk-backup"},
        ],
    })
    assert r.status_code == 200, r.text
    body = r.json()
    policy = (await client.get("/v1/policies/bulk-backup")).json()["policy"]
    assert body["levels"]["integrity"] >= policy["min_levels"]["integrity"]
    assert body["levels"]["confidentiality"] >= policy["min_levels"]["confidentiality"]
    assert body["requirement"]["branch"]["integrity"] == policy["min_levels"]["integrity"]


async def test_editing_md5_to_4_makes_it_the_choice(client: httpx.AsyncClient) -> None:
    """Niedermayer et al. §7.4: 'If HMAC-MD5 would possess a security rating of 4, it would be selected'."""
    table = await client.get("/v1/rating-tables/esaf-2006")
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 4},
                           headers={"If-Match": table.headers["etag"]})
    assert r.status_code == 200, r.text
    r = await negotiate(client, {"rating_table": "esaf-2006",
                                 "peers": [{"name": "app", "min_levels": {"integrity": 4}}]})
    assert r.json()["suite"]["integrity"] == "md5"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"peers": []}, "peers"),
        ({"peers": [{"name": "a", "min_levels": {"integrity": 11}}]}, "integrity"),
        ({"peers": [{"name": "a", "min_levels": {"secrecy": 3}}]}, "secrecy"),
        ({"peers": [{"name": "a"}], "surprise": 1}, "surprise"),
        ({"peers": [{"name": "a", "objective_id": 5}]}, "objective_id"),
        ({"peers": [{"name": "A B"}]}, "name"),
    ],
)
async def test_bad_request_is_422_naming_the_field(client: httpx.AsyncClient, body: dict[str, Any],
                                                    fragment: str) -> None:
    r = await negotiate(client, body)
    assert r.status_code == 422
    assert r.json()["error"] == "ValidationError"
    assert fragment in r.text


async def test_unknown_keyword_is_422_with_close_matches(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "supports": ["aes128", "sha265"]}]})
    assert r.status_code == 422
    assert "sha256" in r.text


async def test_duplicate_peer_names_are_422(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a"}, {"name": "a"}]})
    assert r.status_code == 422
    assert "unique" in r.json()["detail"]


async def test_unknown_policy_and_table_are_404(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "policy": "nope"}]})
    assert r.status_code == 404
    r = await negotiate(client, {"rating_table": "nope", "peers": [{"name": "a"}]})
    assert r.status_code == 404


async def test_unknown_objective_is_422(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "objectives": ["O.Everything"]}]})
    assert r.status_code == 422
    assert "O.Data_Exchange_Conf" in r.text


async def test_objective_id_2_on_libipsec_backend_falls_back_to_esp_null(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "objective_id": 2, "min_levels": {"integrity": 5}}],
                                 "backend": {"name": "kernel-libipsec", "ah": False, "transport": False}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["proposals"]["ah"] is None
    assert body["levels"]["confidentiality"] == 0
    assert any("AH unavailable" in n for n in body["notes"])


async def test_objective_id_2_strict_on_libipsec_backend_is_409(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "objective_id": 2, "strict": True}],
                                 "backend": {"name": "kernel-libipsec", "ah": False, "transport": False}})
    assert r.status_code == 409
    assert r.json()["error"] == "UnsupportedProtection"


async def test_default_table_never_emits_default_or_mixed_proposals(client: httpx.AsyncClient) -> None:
    r = await negotiate(client, {"peers": [{"name": "a", "min_levels": {"confidentiality": 10, "integrity": 8,
                                                                         "key_exchange": 8}}]})
    assert r.status_code == 200, r.text
    proposals = r.json()["proposals"]
    assert "default" not in str(proposals)
    assert r.json()["levels"]["key_exchange"] >= 8


async def test_oversized_body_is_413(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/negotiations", content=b"{" + b" " * 70000 + b"}",
                          headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == "PayloadTooLarge"
