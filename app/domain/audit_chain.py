"""The audit log's hash chain: how an entry is hashed, how entries are linked, how a chain is checked.

Each entry carries ``prev_hash``, the ``hash`` of the entry before it in id order (the first
entry's is :data:`GENESIS`), and its own ``hash``::

    hash = SHA-256( canonical(entry) )                       (lower-case hex, 64 characters)

    canonical(entry) = JSON of every column but ``hash``, prev_hash included:
        {"action", "at", "client_request_id", "detail", "id", "object", "outcome",
         "prev_hash", "request_id", "scopes", "source", "token_id", "token_name"}
        keys sorted, separators "," and ":" (no spaces), non-ASCII as \\uXXXX escapes,
        ``at`` as ISO-8601 UTC with microseconds, e.g. "2026-11-25T09:00:00.000000Z",
        absent values as null, ``scopes`` a list of strings in its stored order, ``outcome`` an integer.

So an entry that is altered no longer matches its ``hash``; an entry removed or moved breaks
the link of the entry after it; and rewriting one entry's hash to cover a change breaks the
next entry's link. The writer and :func:`verify` use these same functions.

Pure: the standard library only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "GENESIS",
    "HASHED_FIELDS",
    "ChainBreak",
    "ChainHead",
    "ChainReport",
    "canonical",
    "entry_hash",
    "format_at",
    "json_line",
    "link",
    "verify",
]

#: The ``prev_hash`` of the first entry.
GENESIS = "0" * 64

#: The fields the hash covers (every column but ``hash``).
HASHED_FIELDS = (
    "action", "at", "client_request_id", "detail", "id", "object", "outcome", "prev_hash", "request_id", "scopes",
    "source", "token_id", "token_name",
)


def format_at(at: datetime) -> str:
    """``at`` as the chain writes it: ISO-8601 UTC with microseconds and a ``Z``.

    Raises:
        ValueError: a naive datetime (its zone would be a guess).
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"naive datetime {at!r}: the audit chain needs a timezone-aware one")
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(entry: Mapping[str, Any]) -> bytes:
    """The bytes an entry's hash is taken over (see the module); ``at`` a datetime or a
    string :func:`format_at` wrote.

    Raises:
        KeyError: a hashed field is missing (``id`` and ``prev_hash`` included).
        ValueError: ``at`` is naive.
    """
    fields = {name: entry[name] for name in HASHED_FIELDS}
    at = fields["at"]
    if isinstance(at, datetime):
        fields["at"] = format_at(at)
    fields["scopes"] = list(fields["scopes"])
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 of :func:`canonical`, lower-case hex."""
    return hashlib.sha256(canonical(entry)).hexdigest()


def json_line(entry: Mapping[str, Any]) -> str:
    """One entry as a line of JSON for export: :func:`canonical`'s form with ``hash`` added, so
    a reader recomputes the hash from the line alone (drop ``hash``, serialise the rest the
    same way, SHA-256)."""
    fields = {name: entry[name] for name in (*HASHED_FIELDS, "hash")}
    if isinstance(fields["at"], datetime):
        fields["at"] = format_at(fields["at"])
    fields["scopes"] = list(fields["scopes"])
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def link(records: Sequence[Mapping[str, Any]], *, ids: Sequence[int], prev_hash: str) -> list[dict[str, Any]]:
    """``records`` as chain entries: each given its id from ``ids``, the hash of the one before
    (``prev_hash`` for the first) and its own hash.

    Raises:
        ValueError: ``ids`` not as many as the records, or not increasing.
    """
    if len(ids) != len(records) or any(b <= a for a, b in itertools.pairwise(ids)):
        raise ValueError("one increasing id per record")
    linked: list[dict[str, Any]] = []
    for record, id_ in zip(records, ids, strict=True):
        entry = {**record, "id": id_, "prev_hash": prev_hash}
        prev_hash = entry["hash"] = entry_hash(entry)
        linked.append(entry)
    return linked


@dataclass(frozen=True, slots=True)
class ChainHead:
    """Where the writer says the chain ends: the last entry's id (None: no entry yet) and hash."""

    last_id: int | None
    hash: str


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first place the chain does not hold.

    ``kind``:
        ``altered``: entry ``id``'s content (or its prev_hash) is not what its hash covers;
        ``unlinked``: entry ``id``'s prev_hash is not its predecessor's hash: an entry before
        it was removed, or entries were reordered or inserted;
        ``truncated``: the chain ends before the head the writer recorded (``id`` is the
        last entry the head names; entries at the end were removed);
        ``head``: the recorded head does not match the chain's last entry otherwise.
    """

    kind: Literal["altered", "unlinked", "truncated", "head"]
    id: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The result of :func:`verify`: how many entries were read, the last one, the first break."""

    entries: int
    last_id: int | None
    last_hash: str
    broken: ChainBreak | None

    @property
    def intact(self) -> bool:
        return self.broken is None


def verify(entries: Iterable[Mapping[str, Any]], *, head: ChainHead | None = None) -> ChainReport:
    """Walk ``entries`` (in id order, read once: constant memory) and report the first break.

    Args:
        entries: every entry, id ascending, each with the hashed fields and ``hash``.
        head: the head the writer recorded, if any: a chain that ends before it was truncated.
    """
    count, last_id, last_hash = 0, None, GENESIS
    iterator: Iterator[Mapping[str, Any]] = iter(entries)
    for entry in iterator:
        id_ = int(entry["id"])
        if entry_hash(entry) != entry["hash"]:
            return ChainReport(count, last_id, last_hash, ChainBreak(
                "altered", id_, f"entry {id_} does not match its hash: it was altered"))
        if entry["prev_hash"] != last_hash:
            before = "the start of the chain" if last_id is None else f"entry {last_id}"
            missing = "" if last_id is None or id_ == last_id + 1 else f" (ids {last_id + 1}-{id_ - 1} are absent)"
            if last_id is None and id_ > 1:
                missing = f" (ids 1-{id_ - 1} are absent)"
            return ChainReport(count, last_id, last_hash, ChainBreak(
                "unlinked", id_, f"entry {id_} does not follow {before}{missing}: an entry before it was "
                "removed, or entries were reordered or inserted"))
        count, last_id, last_hash = count + 1, id_, entry["hash"]
    if head is not None and (head.last_id, head.hash) != (last_id, last_hash):
        if head.last_id is not None and (last_id is None or head.last_id > last_id):
            after = "the start" if last_id is None else f"entry {last_id}"
            return ChainReport(count, last_id, last_hash, ChainBreak(
                "truncated", head.last_id, f"the chain ends at {after} but was written up to entry "
                f"{head.last_id}: entries at its end were removed"))
        return ChainReport(count, last_id, last_hash, ChainBreak(
            "head", last_id, f"the recorded chain head (entry {head.last_id}, {head.hash[:16]}...) does not match "
            f"the last entry ({last_id}, {last_hash[:16]}...)"))
    return ChainReport(count, last_id, last_hash, None)
