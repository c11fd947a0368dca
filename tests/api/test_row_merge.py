"""Row edits made on an older revision through the API: merged over the latest revision when the
rows and fields they touch did not change since, a 409 ``EditConflict`` naming the table, row,
field, both values and the latest revision when they did (nothing written)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio
TABLE = "/v1/rating-tables/esaf-2006"


async def _patch(client: httpx.AsyncClient, algorithm: str, body: dict[str, Any], revision: int,
                 **params: str) -> httpx.Response:
    return await client.patch(f"{TABLE}/ratings/{algorithm}", json=body, params=params,
                              headers={"If-Match": f'"{revision}"'})


async def _rows(client: httpx.AsyncClient) -> tuple[int, dict[str, dict[str, Any]]]:
    table = (await client.get(TABLE)).json()
    return table["revision"], {r["algorithm"]: r for r in table["ratings"]}


async def _history(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = (await client.get(f"{TABLE}/revisions")).json()
    return answer


async def test_two_edits_from_one_revision_on_different_rows_both_land(client: httpx.AsyncClient) -> None:
    bob = await _patch(client, "aes128", {"performance": 7.5}, 1)
    assert bob.status_code == 200, bob.text
    alice = await _patch(client, "md5", {"integrity": 1, "reason": "collisions"}, 1)
    assert alice.status_code == 200, alice.text
    assert (alice.json()["revision"], alice.headers["etag"]) == (3, '"3"')
    revision, rows = await _rows(client)
    assert revision == 3
    assert (rows["aes128"]["performance"], rows["md5"]["integrity"], rows["md5"]["reason"]) == (
        7.5, 1, "collisions")
    alice_rows = {r["algorithm"]: r for r in alice.json()["ratings"]}
    assert alice_rows == rows  # the answer is the merged revision, bob's edit in it
    last = (await _history(client))[-1]
    assert last["message"] == "edited md5 (made on revision 1, merged)"
    assert {(c["algorithm"], c["field"]) for c in last["changes"]} == {("md5", "integrity"), ("md5", "reason")}


async def test_different_fields_of_one_row_both_land(client: httpx.AsyncClient) -> None:
    assert (await _patch(client, "md5", {"performance": 8.5}, 1)).status_code == 200
    merged = await _patch(client, "md5", {"integrity": 1}, 1)
    assert merged.status_code == 200, merged.text
    _, rows = await _rows(client)
    assert (rows["md5"]["performance"], rows["md5"]["integrity"]) == (8.5, 1)


async def test_one_field_changed_to_different_values_is_a_409_with_both_values_and_nothing_written(
        client: httpx.AsyncClient) -> None:
    assert (await _patch(client, "md5", {"integrity": 3}, 1)).status_code == 200
    conflict = await _patch(client, "md5", {"integrity": 1, "reason": "collisions"}, 1)
    assert conflict.status_code == 409
    assert conflict.headers["etag"] == '"2"'
    body = conflict.json()
    assert body["error"] == "EditConflict"
    detail = body["detail"]
    assert (detail["table"], detail["based_on"], detail["revision"]) == ("esaf-2006", 1, 2)
    assert detail["conflicts"] == [{"algorithm": "md5", "field": "integrity", "base": 2, "theirs": 3, "mine": 1}]
    assert detail["message"] == ("esaf-2006: changed since revision 1: md5 integrity is 3 at revision 2, "
                                 "yours is 1")
    revision, rows = await _rows(client)
    assert (revision, rows["md5"]["integrity"]) == (2, 3)
    assert rows["md5"].get("reason") != "collisions"  # no part of the edit was written
    assert [h["revision"] for h in await _history(client)] == [1, 2]
    audited = [e for e in (await client.get("/v1/audit", params={"limit": 20})).json()
               if e["object"] == f"{TABLE}/ratings/md5"]
    assert [(e["outcome"], e["detail"]) for e in audited][:1] == [(409, "EditConflict")]


async def test_the_same_edit_sent_again_on_its_revision_lands_once(client: httpx.AsyncClient) -> None:
    first = await _patch(client, "md5", {"integrity": 1}, 1)
    again = await _patch(client, "md5", {"integrity": 1}, 1)  # a retry after a lost answer
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json() and again.headers["etag"] == '"2"'  # noqa: PT018
    assert [h["revision"] for h in await _history(client)] == [1, 2]


async def test_a_row_removed_since_and_edited_is_a_conflict_over_the_whole_row(client: httpx.AsyncClient) -> None:
    table = (await client.get(TABLE)).json()
    without = {**table, "ratings": [r for r in table["ratings"] if r["algorithm"] != "md5"]}
    del without["revision"]
    assert (await client.put(TABLE, json=without, headers={"If-Match": '"1"'})).status_code == 200
    conflict = await _patch(client, "md5", {"integrity": 1}, 1)
    assert conflict.status_code == 409
    [clash] = conflict.json()["detail"]["conflicts"]
    assert (clash["algorithm"], clash["field"], clash["theirs"], clash["mine"]["integrity"]) == ("md5", "*", None, 1)
    assert "md5 was removed at revision 2" in conflict.json()["detail"]["message"]
    added = await _patch(client, "sha256", {"integrity": 8, "performance": 3}, 1)  # a new row lands merged
    assert added.status_code == 200, added.text
    _, rows = await _rows(client)
    assert "md5" not in rows and rows["sha256"]["integrity"] == 8  # noqa: PT018


async def test_if_match_is_otherwise_as_before(client: httpx.AsyncClient) -> None:
    future = await _patch(client, "md5", {"integrity": 1}, 9)
    assert (future.status_code, future.json()["error"], future.headers["etag"]) == (409, "StaleRevision", '"1"')
    assert (await client.patch(f"{TABLE}/ratings/md5", json={"integrity": 1})).status_code == 428
    assert (await _patch(client, "aes128", {"performance": 7.5}, 1)).status_code == 200
    document = {k: v for k, v in (await client.get(TABLE)).json().items() if k != "revision"}
    stale_put = await client.put(TABLE, json=document, headers={"If-Match": '"1"'})  # a whole table: no merge
    assert (stale_put.status_code, stale_put.json()["error"]) == (409, "StaleRevision")
    stale_revert = await client.post(f"{TABLE}/revert", json={"revision": 1}, headers={"If-Match": '"1"'})
    assert (stale_revert.status_code, stale_revert.json()["error"]) == (409, "StaleRevision")
    assert [h["revision"] for h in await _history(client)] == [1, 2]


async def test_a_dry_run_on_an_older_revision_answers_the_merged_table_and_keeps_nothing(
        client: httpx.AsyncClient) -> None:
    assert (await _patch(client, "aes128", {"performance": 7.5}, 1)).status_code == 200
    dry = await _patch(client, "md5", {"integrity": 1}, 1, dry_run="true")
    assert dry.status_code == 200, dry.text
    would_be = {r["algorithm"]: r for r in dry.json()["would_be"]["ratings"]}
    assert (dry.json()["would_be"]["revision"], would_be["aes128"]["performance"], would_be["md5"]["integrity"]) == (
        3, 7.5, 1)
    revision, rows = await _rows(client)
    assert (revision, rows["md5"]["integrity"]) == (2, 2)


async def test_concurrent_edits_of_different_rows_from_one_revision_all_land(client: httpx.AsyncClient) -> None:
    """Each write that finds another came first merges again over it (PostgreSQL runs them at once)."""
    _, rows = await _rows(client)
    answers = await asyncio.gather(*(_patch(client, alg, {"performance": 1 + i / 10}, 1)
                                     for i, alg in enumerate(rows)))
    assert [a.status_code for a in answers] == [200] * len(rows), [a.text for a in answers if a.status_code != 200]
    revision, after = await _rows(client)
    assert revision == 1 + len(rows)
    assert [after[alg]["performance"] for alg in rows] == [1 + i / 10 for i in range(len(rows))]
