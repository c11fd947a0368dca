"""The audit chain's pure core: what a hash covers, how entries link, what verify finds."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from app.domain.audit_chain import GENESIS, ChainHead, canonical, entry_hash, json_line, link, verify


def record(n: int) -> dict[str, Any]:
    return {"at": datetime(2026, 11, 25, 9, 0, n, 123456, tzinfo=UTC), "request_id": f"r-{n}",
            "client_request_id": None, "token_id": "0123456789ab", "token_name": "ops", "scopes": ["admin"],
            "source": "10.0.0.1", "action": "POST", "object": f"/v1/policies/p{n}", "outcome": 201,
            "detail": f"détail {n}"}


def chain(n: int) -> list[dict[str, Any]]:
    return link([record(i) for i in range(n)], ids=list(range(1, n + 1)), prev_hash=GENESIS)


def test_the_hash_is_sha256_of_sorted_compact_json_with_at_in_utc() -> None:
    (entry,) = chain(1)
    body = json.loads(canonical(entry))
    assert list(body) == sorted(body)
    assert body["at"] == "2026-11-25T09:00:00.123456Z"
    assert body["prev_hash"] == GENESIS
    assert "hash" not in body
    assert entry["hash"] == hashlib.sha256(canonical(entry)).hexdigest()
    assert b'"detail":"d\\u00e9tail 0","id":1,' in canonical(entry)  # ASCII, no spaces between


def test_the_same_instant_in_another_zone_hashes_the_same() -> None:
    (entry,) = chain(1)
    elsewhere = {**entry, "at": entry["at"].astimezone(timezone(timedelta(hours=5)))}
    assert entry_hash(elsewhere) == entry["hash"]


def test_every_hashed_field_changes_the_hash() -> None:
    (entry,) = chain(1)
    changes = {"id": 2, "prev_hash": "1" * 64, "outcome": 200, "scopes": ["admin", "x"], "token_id": None,
               "detail": "other", "at": entry["at"] + timedelta(microseconds=1), "client_request_id": "c"}
    for field in ("request_id", "token_name", "source", "action", "object"):
        changes[field] = entry[field] + "x"
    for field, value in changes.items():
        assert entry_hash({**entry, field: value}) != entry["hash"], field


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        entry_hash({**chain(1)[0], "at": datetime(2026, 1, 1)})


def test_link_needs_increasing_ids() -> None:
    with pytest.raises(ValueError, match="increasing"):
        link([record(0), record(1)], ids=[2, 2], prev_hash=GENESIS)


def test_an_intact_chain_verifies_with_its_head() -> None:
    entries = chain(5)
    report = verify(entries, head=ChainHead(5, entries[-1]["hash"]))
    assert report.intact
    assert report.entries == 5
    assert report.last_id == 5


def test_an_empty_chain_verifies_against_an_empty_head() -> None:
    assert verify([], head=ChainHead(None, GENESIS)).intact


def test_an_altered_entry_is_named() -> None:
    entries = chain(5)
    entries[2]["detail"] = "rewritten"
    report = verify(entries)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("altered", 3)
    assert report.entries == 2


def test_an_altered_entry_with_its_hash_recomputed_breaks_the_next_link() -> None:
    entries = chain(5)
    entries[2]["detail"] = "rewritten"
    entries[2]["hash"] = entry_hash(entries[2])
    report = verify(entries)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("unlinked", 4)


def test_a_removed_entry_names_the_next_one_and_the_missing_ids() -> None:
    entries = chain(5)
    del entries[2]
    report = verify(entries)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("unlinked", 4)
    assert "3-3" in report.broken.detail


def test_a_removed_first_entry_is_found() -> None:
    report = verify(chain(3)[1:])
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("unlinked", 2)


def test_swapped_entries_are_found() -> None:
    entries = chain(4)
    entries[1], entries[2] = entries[2], entries[1]
    report = verify(entries)
    assert report.broken is not None
    assert report.broken.kind == "unlinked"


def test_a_gap_in_ids_with_the_link_intact_is_no_break() -> None:
    entries = link([record(i) for i in range(3)], ids=[1, 5, 6], prev_hash=GENESIS)  # ids a rollback used
    assert verify(entries).intact


def test_entries_removed_from_the_end_are_found_by_the_head() -> None:
    entries = chain(5)
    report = verify(entries[:3], head=ChainHead(5, entries[-1]["hash"]))
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("truncated", 5)
    report = verify([], head=ChainHead(5, entries[-1]["hash"]))
    assert report.broken is not None
    assert report.broken.kind == "truncated"


def test_a_head_that_does_not_match_the_last_entry_is_reported() -> None:
    entries = chain(3)
    report = verify(entries, head=ChainHead(3, "f" * 64))
    assert report.broken is not None
    assert report.broken.kind == "head"


def test_an_exported_line_carries_what_its_hash_is_recomputed_from() -> None:
    entries = chain(3)
    parsed = [json.loads(json_line(e)) for e in entries]
    assert [p["hash"] for p in parsed] == [e["hash"] for e in entries]
    assert all(entry_hash(p) == p["hash"] for p in parsed)
    assert all(json_line(p) == json_line(e) for p, e in zip(parsed, entries, strict=True))
    assert verify(parsed).intact
