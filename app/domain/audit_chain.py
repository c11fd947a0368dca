"""The audit log's hash chain: how an entry is hashed, how entries are linked, how a chain is checked.

Each entry carries ``prev_hash``, the ``hash`` of the entry before it in id order (the first
entry's is :data:`GENESIS`), and its own ``hash``::

    hash = HMAC-SHA256( entry key, canonical(entry) )        (lower-case hex, 64 characters)

    entry key = HMAC-SHA256( audit key, "qoss audit entry" )

The audit key is kept outside the database (:class:`ChainKey`), so whoever can write the
database cannot recompute a hash. Entries written before the chain was keyed carry
``SHA-256( canonical(entry) )`` instead; :func:`verify` accepts those only before the first
keyed entry: once keyed, every later entry must be.

    canonical(entry) = JSON of every column but ``hash``, prev_hash included:
        {"action", "at", "client_request_id", "detail", "id", "object", "outcome",
         "prev_hash", "request_id", "scopes", "source", "token_id", "token_name"}
        keys sorted, separators "," and ":" (no spaces), non-ASCII as \\uXXXX escapes,
        ``at`` as ISO-8601 UTC with microseconds, e.g. "2026-11-25T09:00:00.000000Z",
        absent values as null, ``scopes`` a list of strings in its stored order, ``outcome`` an integer.

So an entry that is altered no longer matches its ``hash``; an entry removed or moved breaks
the link of the entry after it; and rewriting one entry's hash to cover a change breaks the
next entry's link. Re-hashing every entry after a change needs the key.

Entries removed from the end leave no break behind them; so the chain's end is also written
outside the database, in checkpoints (:class:`Checkpoint`: an entry's id and hash, and a MAC
under ``HMAC-SHA256( audit key, "qoss audit checkpoint" )``). A chain that ends before a
checkpoint's entry, or whose entry differs from a checkpoint's, was cut or rewritten.
The writer and :func:`verify` use these same functions.

Pure: the standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "GENESIS",
    "HASHED_FIELDS",
    "KEY_BYTES",
    "ChainBreak",
    "ChainHead",
    "ChainKey",
    "ChainReport",
    "Checkpoint",
    "canonical",
    "checkpoint_line",
    "entry_hash",
    "format_at",
    "json_line",
    "link",
    "read_checkpoint",
    "verify",
]

#: The ``prev_hash`` of the first entry.
GENESIS = "0" * 64

#: The fields the hash covers (every column but ``hash``).
HASHED_FIELDS = (
    "action", "at", "client_request_id", "detail", "id", "object", "outcome", "prev_hash", "request_id", "scopes",
    "source", "token_id", "token_name",
)


#: The least length of an audit key, in bytes.
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class ChainKey:
    """The two keys derived from the audit key: one for entries, one for checkpoints (never shown)."""

    entry: bytes = field(repr=False)
    checkpoint: bytes = field(repr=False)

    @classmethod
    def derive(cls, secret: bytes) -> ChainKey:
        """The keys of ``secret``, the audit key's bytes.

        Raises:
            ValueError: fewer than :data:`KEY_BYTES` bytes.
        """
        if len(secret) < KEY_BYTES:
            raise ValueError(f"an audit key is at least {KEY_BYTES} bytes, not {len(secret)}")
        return cls(hmac.new(secret, b"qoss audit entry", hashlib.sha256).digest(),
                   hmac.new(secret, b"qoss audit checkpoint", hashlib.sha256).digest())


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


def entry_hash(entry: Mapping[str, Any], key: ChainKey | None = None) -> str:
    """HMAC-SHA256 of :func:`canonical` under ``key``'s entry key, lower-case hex; without a key,
    SHA-256 (an entry from before the chain was keyed)."""
    if key is None:
        return hashlib.sha256(canonical(entry)).hexdigest()
    return hmac.new(key.entry, canonical(entry), hashlib.sha256).hexdigest()


def json_line(entry: Mapping[str, Any]) -> str:
    """One entry as a line of JSON for export: :func:`canonical`'s form with ``hash`` added, so
    a reader recomputes the hash from the line and the audit key (drop ``hash``, serialise the
    rest the same way, HMAC-SHA256 under the entry key; SHA-256 for entries from before keying)."""
    fields = {name: entry[name] for name in (*HASHED_FIELDS, "hash")}
    if isinstance(fields["at"], datetime):
        fields["at"] = format_at(fields["at"])
    fields["scopes"] = list(fields["scopes"])
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def link(
    records: Sequence[Mapping[str, Any]], *, ids: Sequence[int], prev_hash: str, key: ChainKey | None = None,
) -> list[dict[str, Any]]:
    """``records`` as chain entries: each given its id from ``ids``, the hash of the one before
    (``prev_hash`` for the first) and its own hash (keyed with ``key``).

    Raises:
        ValueError: ``ids`` not as many as the records, or not increasing.
    """
    if len(ids) != len(records) or any(b <= a for a, b in itertools.pairwise(ids)):
        raise ValueError("one increasing id per record")
    linked: list[dict[str, Any]] = []
    for record, id_ in zip(records, ids, strict=True):
        entry = {**record, "id": id_, "prev_hash": prev_hash}
        prev_hash = entry["hash"] = entry_hash(entry, key)
        linked.append(entry)
    return linked


@dataclass(frozen=True, slots=True)
class ChainHead:
    """Where the writer says the chain ends: the last entry's id (None: no entry yet) and hash."""

    last_id: int | None
    hash: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The chain's end as a writer saw it, kept outside the database: entry ``last_id`` had ``hash``
    at ``at`` (ISO-8601 UTC, :func:`format_at`)."""

    last_id: int
    hash: str
    at: str


def _checkpoint_body(checkpoint: Checkpoint) -> bytes:
    fields = {"at": checkpoint.at, "hash": checkpoint.hash, "last_id": checkpoint.last_id}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def checkpoint_line(checkpoint: Checkpoint, key: ChainKey) -> str:
    """One checkpoint as a line of JSON, ``{"at", "hash", "last_id", "mac"}``: ``mac`` is
    HMAC-SHA256 under the checkpoint key of the line's other fields (sorted, compact JSON)."""
    body = _checkpoint_body(checkpoint)
    mac = hmac.new(key.checkpoint, body, hashlib.sha256).hexdigest()
    fields = {"at": checkpoint.at, "hash": checkpoint.hash, "last_id": checkpoint.last_id, "mac": mac}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def read_checkpoint(line: str, key: ChainKey) -> Checkpoint:
    """The checkpoint of a line :func:`checkpoint_line` wrote with the same key.

    Raises:
        ValueError: not such a line, or its MAC does not hold (altered, or another key's).
    """
    try:
        fields = json.loads(line)
        checkpoint = Checkpoint(int(fields["last_id"]), str(fields["hash"]), str(fields["at"]))
        mac = str(fields["mac"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a checkpoint: {exc}") from exc
    expected = hmac.new(key.checkpoint, _checkpoint_body(checkpoint), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected):
        raise ValueError(f"the checkpoint of entry {checkpoint.last_id} does not match its MAC: it was altered, "
                         "or written with another key")
    return checkpoint


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first place the chain does not hold.

    ``kind``:
        ``altered``: entry ``id``'s content (or its prev_hash) is not what its hash covers;
        ``unlinked``: entry ``id``'s prev_hash is not its predecessor's hash: an entry before
        it was removed, or entries were reordered or inserted;
        ``rewritten``: entry ``id`` is not the entry a checkpoint recorded (or is missing): an
        entry up to it was altered and the chain re-hashed after it;
        ``truncated``: the chain ends before a checkpoint's entry or the head the writer
        recorded (``id`` is that entry; entries at the end were removed);
        ``head``: the recorded head does not match the chain's last entry otherwise.
    """

    kind: Literal["altered", "unlinked", "rewritten", "truncated", "head"]
    id: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The result of :func:`verify`: how many entries were read, the last one, the first break;
    the first keyed entry (None: none is) and how many checkpoints the chain was held against."""

    entries: int
    last_id: int | None
    last_hash: str
    broken: ChainBreak | None
    keyed_from: int | None = None
    checkpoints: int = 0

    @property
    def intact(self) -> bool:
        return self.broken is None


def _altered(id_: int, key: ChainKey | None, keyed_from: int | None) -> str:
    if keyed_from is not None:
        return (f"entry {id_} altered: it does not match its keyed hash (the chain is keyed from entry "
                f"{keyed_from} on): it was changed, or re-hashed without the key")
    if key is None:
        return (f"entry {id_} altered: it does not match its hash (or it is keyed, and the chain was checked "
                "without the key)")
    return f"entry {id_} altered: it matches neither its keyed hash nor a hash from before keying"


def verify(
    entries: Iterable[Mapping[str, Any]], *, head: ChainHead | None = None, key: ChainKey | None = None,
    checkpoints: Iterable[Checkpoint] = (),
) -> ChainReport:
    """Walk ``entries`` (in id order, read once: constant memory) and report the first break.

    An entry's hash is its keyed hash (with ``key``), or, before the first keyed entry, its
    unkeyed one; once an entry is keyed, every later one must be.

    Args:
        entries: every entry, id ascending, each with the hashed fields and ``hash``.
        head: the head the writer recorded, if any: a chain that ends before it was truncated.
        key: the audit key (None: only unkeyed entries can hold).
        checkpoints: checkpoints read back (:func:`read_checkpoint`): each entry they name must
            be in the chain with their hash.
    """
    marks = sorted(checkpoints, key=lambda c: c.last_id)
    count, last_id, last_hash, keyed_from, held, m = 0, None, GENESIS, None, 0, 0

    def report(broken: ChainBreak | None) -> ChainReport:
        return ChainReport(count, last_id, last_hash, broken, keyed_from, held)

    iterator: Iterator[Mapping[str, Any]] = iter(entries)
    for entry in iterator:
        id_ = int(entry["id"])
        stored = str(entry["hash"])
        if key is not None and hmac.compare_digest(entry_hash(entry, key), stored):
            keyed_from = id_ if keyed_from is None else keyed_from
        elif keyed_from is not None or entry_hash(entry) != stored:
            return report(ChainBreak("altered", id_, _altered(id_, key, keyed_from)))
        if entry["prev_hash"] != last_hash:
            before = "the start of the chain" if last_id is None else f"entry {last_id}"
            missing = "" if last_id is None or id_ == last_id + 1 else f" (ids {last_id + 1}-{id_ - 1} are absent)"
            if last_id is None and id_ > 1:
                missing = f" (ids 1-{id_ - 1} are absent)"
            return report(ChainBreak(
                "unlinked", id_, f"entry {id_} does not follow {before}{missing}: an entry before it was "
                "removed, or entries were reordered or inserted"))
        if m < len(marks) and marks[m].last_id < id_:
            mark = marks[m]
            return report(ChainBreak(
                "rewritten", mark.last_id, f"entry {mark.last_id} is missing, though checkpoint ({mark.at}) "
                f"recorded it with hash {mark.hash}: entries up to it were removed and the chain re-hashed"))
        while m < len(marks) and marks[m].last_id == id_:
            mark = marks[m]
            if not hmac.compare_digest(mark.hash, stored):
                return report(ChainBreak(
                    "rewritten", id_, f"entries up to {id_} rewritten: entry {id_} has hash {stored} but checkpoint "
                    f"({mark.at}) recorded {mark.hash}: an entry up to it was altered and the chain re-hashed "
                    "after it"))
            held, m = held + 1, m + 1
        count, last_id, last_hash = count + 1, id_, stored
    if m < len(marks):
        mark = marks[-1]
        end = "the chain is empty" if last_id is None else f"the chain ends at entry {last_id}"
        return report(ChainBreak(
            "truncated", mark.last_id, f"tail cut after entry {last_id} (checkpoint {mark.last_id}): {end} but the "
            f"checkpoint of {mark.at} says entry {mark.last_id} with hash {mark.hash}: entries at its end were "
            "removed"))
    if head is not None and (head.last_id, head.hash) != (last_id, last_hash):
        if head.last_id is not None and (last_id is None or head.last_id > last_id):
            after = "the start" if last_id is None else f"entry {last_id}"
            return report(ChainBreak(
                "truncated", head.last_id, f"the chain ends at {after} but was written up to entry "
                f"{head.last_id}: entries at its end were removed"))
        return report(ChainBreak(
            "head", last_id, f"the recorded chain head (entry {head.last_id}, {head.hash[:16]}...) does not match "
            f"the last entry ({last_id}, {last_hash[:16]}...)"))
    return report(None)
