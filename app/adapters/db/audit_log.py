"""The audit log as a hash chain: check it, export it (``qoss audit verify``, ``qoss audit export``,
``GET /v1/audit?format=jsonl``). Entries are written by :mod:`app.adapters.db.audit_chain`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

from sqlalchemy.orm import Session

from app.adapters.db import audit_chain
from app.domain.audit_chain import ChainBreak, ChainReport, json_line, verify

__all__ = ["export_lines", "verify_log"]


def verify_log(*, session: Session) -> ChainReport:
    """Walk the whole chain in id order (one snapshot, streamed) and report its first break.

    The chain's end is checked against the head the writers record: entries removed from the
    end are found too, unless the head was rewritten with them.
    """
    audit_chain.snapshot(session)
    head = audit_chain.head(session)
    with closing(audit_chain.entries(session)) as entries:  # verify stops at the first break
        report = verify(entries, head=head)
    if head is None and report.intact:
        return ChainReport(report.entries, report.last_id, report.last_hash, ChainBreak(
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
