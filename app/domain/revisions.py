"""Revisions of named documents (rating tables, policies): the rules of going back to one."""

from __future__ import annotations

from typing import Any

from app.domain.errors import InvalidInput, StaleRevision
from app.domain.ratings import LEVEL_DIMENSIONS

__all__ = ["check_revert", "diff_policies", "diff_tables", "revert_message"]


def check_revert(name: str, revision: int, expected_revision: int, current: int) -> None:
    """A revert of ``name`` to ``revision``, based on ``expected_revision``, may go ahead.

    Raises:
        StaleRevision: ``expected_revision`` is not the current revision (If-Match).
        InvalidInput: ``revision`` is the current one: there is nothing to revert.
    """
    if current != expected_revision:
        raise StaleRevision(name, expected_revision, current)
    if revision == current:
        raise InvalidInput(f"{name!r} is at revision {revision} already: nothing to revert")


def revert_message(revision: int, message: str | None) -> str:
    """The history message of a revert: ``reverted to N``, then the caller's reason."""
    return f"reverted to {revision}" + (f": {message}" if message else "")


_ROW_FIELDS = (*LEVEL_DIMENSIONS, "performance", "source", "reason", "requirement", "measurement")


def diff_tables(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-algorithm, per-field changes between two table documents.

    Args:
        old: The previous revision's ``RatingTable.as_dict()``, None for a new table.
        new: The new revision's ``RatingTable.as_dict()``.

    Returns:
        ``{"algorithm", "field", "old", "new"}`` entries: a whole row added or removed is
        field ``"*"``; a table-level field (description, source) has algorithm None.
    """
    before = {r["algorithm"]: r for r in (old or {}).get("ratings", [])}
    after = {r["algorithm"]: r for r in new.get("ratings", [])}
    changes: list[dict[str, Any]] = []
    for alg in [*after, *[a for a in before if a not in after]]:
        b, a = before.get(alg, {}), after.get(alg, {})
        if not b:
            changes.append({"algorithm": alg, "field": "*", "old": None, "new": "added"})
            continue
        if not a:
            changes.append({"algorithm": alg, "field": "*", "old": "present", "new": "removed"})
            continue
        for field in _ROW_FIELDS:
            if b.get(field) != a.get(field):
                changes.append({"algorithm": alg, "field": field, "old": b.get(field), "new": a.get(field)})
    for field in ("description", "source"):
        if old is not None and old.get(field) != new.get(field):
            changes.append({"algorithm": None, "field": field, "old": old.get(field), "new": new.get(field)})
    return changes


def diff_policies(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-field changes between two policy documents (``Policy.as_dict()``).

    Args:
        old: The previous revision's document, None for the first revision.
        new: This revision's document.

    Returns:
        ``{"field", "old", "new"}`` entries sorted by field (PostgreSQL's JSONB keeps no key
        order); empty for the first revision.
    """
    if old is None:
        return []
    return [
        {"field": key, "old": old.get(key), "new": new.get(key)}
        for key in sorted({*old, *new})
        if old.get(key) != new.get(key)
    ]
