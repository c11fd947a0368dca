"""The audit log as a hash chain: check it, export it (``qoss audit verify``, ``qoss audit export``,
``GET /v1/audit?format=jsonl``). Entries are written by :mod:`app.adapters.db.audit_chain`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path

from sqlalchemy.orm import Session

from app.adapters.audit_seal import AuditKeyError, AuditSeal
from app.adapters.db import audit_chain
from app.domain.audit_chain import ChainBreak, ChainReport, json_line, verify

__all__ = ["export_lines", "verify_log"]


def verify_log(
    *, session: Session, seal: AuditSeal | None = None, more_checkpoints: Sequence[Path] = (),
) -> ChainReport:
    """Walk the whole chain in id order (one snapshot, streamed) and report its first break.

    Keyed entries are checked with the audit key (never made here). The chain's end is held
    against the checkpoints (the seal's file and ``more_checkpoints``, other replicas' copies)
    and the head the writers record: entries removed from the end before the last checkpoint
    are found even when the head was rewritten with them.

    Args:
        session: a read session.
        seal: where the key and checkpoints are (None: the engine's, else the environment's).
        more_checkpoints: more checkpoint files.

    Raises:
        AuditKeyError: there are checkpoints but no key to check them with.
        BadCheckpoint: a checkpoint line does not hold (the checkpoints file was altered).
    """
    seal = seal or audit_chain.writer_of(session.get_bind()).seal
    key = seal.read_key()
    if key is None and (more_checkpoints or seal.has_checkpoints()):
        raise AuditKeyError(f"there are audit checkpoints but no audit key at {seal.key_location} to check them "
                            "with: copy the key here (or set QOSS_AUDIT_KEY_FILE)")
    checkpoints = [] if key is None else seal.read_checkpoints(key, more=more_checkpoints)
    audit_chain.snapshot(session)
    head = audit_chain.head(session)
    with closing(audit_chain.entries(session)) as entries:  # verify stops at the first break
        report = verify(entries, head=head, key=key, checkpoints=checkpoints)
    if key is None and report.broken is not None and report.broken.kind == "altered":
        return replace(report, broken=replace(report.broken, detail=(
            f"entry {report.broken.id} has no unkeyed hash, and there is no audit key at {seal.key_location} to "
            "check a keyed one: it was altered, or the key is missing here (copy it, or set QOSS_AUDIT_KEY_FILE)")))
    if head is None and report.intact:
        return replace(report, broken=ChainBreak(
            "head", report.last_id, "the recorded chain head is missing: entries removed from the end of the "
            "chain cannot be ruled out"))
    return report


def export_lines(
    *, session: Session, since: int | None = None, before: int | None = None, limit: int | None = None,
) -> Iterator[str]:
    """Entries after id ``since`` (all if None) and before id ``before``, oldest first, at most
    ``limit``, each one line of JSON with its ``prev_hash`` and ``hash``
    (:func:`app.domain.audit_chain.json_line`), streamed."""
    with closing(audit_chain.entries(session, after=since, before=before, limit=limit)) as entries:
        for entry in entries:
            yield json_line(entry)
