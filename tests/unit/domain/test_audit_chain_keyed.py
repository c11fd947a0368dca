"""The keyed audit chain: entries re-hashed without the key, a cut tail and rewritten entries
are found; an older unkeyed chain still holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.domain.audit_chain import (
    GENESIS,
    ChainHead,
    ChainKey,
    Checkpoint,
    checkpoint_line,
    entry_hash,
    link,
    read_checkpoint,
    verify,
)

KEY = ChainKey.derive(bytes(range(32)))


def record(n: int) -> dict[str, Any]:
    return {"at": datetime(2026, 11, 26, 9, 0, n, tzinfo=UTC), "request_id": f"r-{n}", "client_request_id": None,
            "token_id": None, "token_name": "ops", "scopes": ["admin"], "source": "10.0.0.1", "action": "POST",
            "object": f"/v1/policies/p{n}", "outcome": 201, "detail": ""}


def chain(n: int, key: ChainKey | None = KEY) -> list[dict[str, Any]]:
    return link([record(i) for i in range(n)], ids=list(range(1, n + 1)), prev_hash=GENESIS, key=key)


def mark(entry: dict[str, Any]) -> Checkpoint:
    return Checkpoint(entry["id"], entry["hash"], "2026-11-26T09:00:00.000000Z")


def rehash_from(entries: list[dict[str, Any]], index: int, key: ChainKey | None) -> None:
    for i in range(index, len(entries)):
        if i:
            entries[i]["prev_hash"] = entries[i - 1]["hash"]
        entries[i]["hash"] = entry_hash(entries[i], key)


def test_a_keyed_chain_verifies_with_its_key_and_checkpoints() -> None:
    entries = chain(6)
    report = verify(entries, head=ChainHead(6, entries[-1]["hash"]), key=KEY,
                    checkpoints=[mark(entries[0]), mark(entries[3])])
    assert report.intact
    assert (report.keyed_from, report.checkpoints) == (1, 2)


@pytest.mark.parametrize("rehash_key", [None, ChainKey.derive(b"g" * 32)], ids=["unkeyed", "guessed-key"])
def test_an_entry_rehashed_onward_without_the_key_is_named(rehash_key: ChainKey | None) -> None:
    entries = chain(6)
    entries[2]["detail"] = "rewritten"
    rehash_from(entries, 2, rehash_key)
    report = verify(entries, head=ChainHead(6, entries[-1]["hash"]), key=KEY)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("altered", 3)
    assert report.broken.detail.startswith("entry 3 altered")


def test_a_cut_tail_with_the_head_rewritten_is_found_by_the_checkpoint() -> None:
    entries = chain(6)
    checkpoint = mark(entries[4])
    kept = entries[:3]
    report = verify(kept, head=ChainHead(3, kept[-1]["hash"]), key=KEY, checkpoints=[mark(entries[0]), checkpoint])
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("truncated", 5)
    assert report.broken.detail.startswith("tail cut after entry 3 (checkpoint 5): the chain ends at entry 3 but")
    assert checkpoint.hash in report.broken.detail


def test_a_chain_rewritten_before_a_checkpoint_is_found() -> None:
    entries = chain(4, key=None)  # unkeyed (from before keying): anyone can re-hash it
    checkpoint = mark(entries[3])
    entries[1]["detail"] = "rewritten"
    rehash_from(entries, 1, None)
    report = verify(entries, key=KEY, checkpoints=[checkpoint])
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("rewritten", 4)


def test_an_entry_a_checkpoint_names_must_be_there() -> None:
    entries = chain(5)
    report = verify([e for e in entries if e["id"] != 3], key=KEY, checkpoints=[mark(entries[2])])
    assert report.broken is not None
    assert report.broken.id in (3, 4)


def test_an_older_unkeyed_chain_verifies_and_is_keyed_onward() -> None:
    old = chain(3, key=None)
    assert verify(old).intact
    assert verify(old, key=KEY).intact
    new = link([record(i) for i in range(3, 5)], ids=[4, 5], prev_hash=old[-1]["hash"], key=KEY)
    report = verify([*old, *new], key=KEY, checkpoints=[mark(new[0])])
    assert report.intact
    assert report.keyed_from == 4


def test_once_keyed_no_entry_may_be_unkeyed() -> None:
    entries = chain(4)
    rehash_from(entries, 3, None)  # the last one only: its link to entry 3 holds
    report = verify(entries, key=KEY)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("altered", 4)


def test_a_checkpoint_line_round_trips_and_a_forged_one_is_refused() -> None:
    checkpoint = mark(chain(1)[0])
    line = checkpoint_line(checkpoint, KEY)
    assert read_checkpoint(line, KEY) == checkpoint
    with pytest.raises(ValueError, match="MAC"):
        read_checkpoint(line.replace('"last_id":1', '"last_id":2'), KEY)
    with pytest.raises(ValueError, match="MAC"):
        read_checkpoint(line, ChainKey.derive(b"o" * 32))
    with pytest.raises(ValueError, match="not a checkpoint"):
        read_checkpoint("{}", KEY)


def test_a_short_key_is_refused_and_a_key_is_never_shown() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        ChainKey.derive(b"short")
    assert KEY.entry.hex() not in repr(KEY)
