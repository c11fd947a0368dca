"""Three-way merge of rating table and policy documents: an edit made on an older revision
applied over the latest one.

An edit is based on revision N (``base``); others may have saved since (``theirs``, the latest
revision); the edit is ``mine``. Row by row (by algorithm) and field by field, a value only one
side changed takes that side's value, a value both changed to the same thing is kept, and a
value both changed to different things is a conflict. A row added on one side is kept, a row
removed on one side is removed unless the other side changed it (then the whole row, field
``"*"``, is a conflict). The table's description and source merge the same way.

A policy merges field by field the same way; a mapping field (``min_levels``, ``traffic``) key
by key, named ``min_levels.integrity``; a list (``allow``, ``deny``, ``objectives``) is one value.

Documents are ``RatingTable.as_dict()`` and ``Policy.as_dict()`` forms: an absent field and None
are the same value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WHOLE_ROW", "FieldConflict", "merge_policies", "merge_tables"]

#: The field of a conflict over a whole row: one side removed it, the other changed it.
WHOLE_ROW = "*"

_TABLE_FIELDS = ("description", "source")


@dataclass(frozen=True, slots=True)
class FieldConflict:
    """One value both sides changed, to different values, since the base revision.

    ``algorithm`` is None for a table-level field (description, source). For a whole row
    (``field == "*"``) the values are the row documents, None where that side removed it.
    """

    algorithm: str | None
    field: str
    base: Any
    theirs: Any
    mine: Any

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "field": self.field, "base": self.base, "theirs": self.theirs,
                "mine": self.mine}


#: What :func:`_merged` answers for a value both sides changed to different values.
_CLASH = object()


def _merged(base: Any, theirs: Any, mine: Any) -> Any:
    """The merged value of one field: the side that changed it wins; both the same, that value;
    :data:`_CLASH` when both changed it to different values."""
    if mine == base or theirs == mine:
        return theirs
    if theirs == base:
        return mine
    return _CLASH


def _merge_row(algorithm: str, base: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None,
               mine: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, list[FieldConflict]]:
    """One row's merge: the merged row (None: removed) and its conflicts."""
    whole = _merged(base, theirs, mine)
    if whole is not _CLASH:
        return (dict(whole) if whole is not None else None), []
    if theirs is None or mine is None:  # one side removed the row, the other changed it
        return None, [FieldConflict(algorithm, WHOLE_ROW, _plain(base), _plain(theirs), _plain(mine))]
    before = base or {}  # both added the row: every field they disagree on is a conflict
    merged: dict[str, Any] = {"algorithm": algorithm}
    conflicts = []
    for field in _fields(before, theirs, mine):
        value = _merged(before.get(field), theirs.get(field), mine.get(field))
        if value is _CLASH:
            conflicts.append(FieldConflict(algorithm, field, before.get(field), theirs.get(field), mine.get(field)))
        elif value is not None:
            merged[field] = value
    return merged, conflicts


def merge_tables(base: Mapping[str, Any], theirs: Mapping[str, Any],
                 mine: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldConflict]]:
    """Merge an edit (``mine``, made on ``base``) over the latest revision (``theirs``).

    Args:
        base: The revision the edit was made on, as ``RatingTable.as_dict()``.
        theirs: The latest revision.
        mine: The edited table.

    Returns:
        The merged document (rows in the latest revision's order, rows only the edit added
        after them) and the conflicts, in that order; with any conflict the document is not
        to be stored.
    """
    rows = {side: _rows(doc) for side, doc in (("base", base), ("theirs", theirs), ("mine", mine))}
    order = [*rows["theirs"], *[a for a in rows["mine"] if a not in rows["theirs"]],
             *[a for a in rows["base"] if a not in rows["theirs"] and a not in rows["mine"]]]
    merged_rows = []
    conflicts: list[FieldConflict] = []
    for algorithm in order:
        row, clashes = _merge_row(algorithm, rows["base"].get(algorithm), rows["theirs"].get(algorithm),
                                  rows["mine"].get(algorithm))
        conflicts.extend(clashes)
        if row is not None:
            merged_rows.append(row)
    document: dict[str, Any] = {"name": theirs.get("name")}
    for field in _TABLE_FIELDS:
        b, t, m = (doc.get(field) or "" for doc in (base, theirs, mine))
        value = _merged(b, t, m)
        if value is _CLASH:
            conflicts.append(FieldConflict(None, field, b, t, m))
        document[field] = value if value is not _CLASH else t
    document["ratings"] = merged_rows
    return document, conflicts


def merge_policies(base: Mapping[str, Any], theirs: Mapping[str, Any],
                   mine: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldConflict]]:
    """Merge an edited policy (``mine``, made on ``base``) over the latest revision (``theirs``),
    as ``Policy.as_dict()`` forms: the merged document and the conflicts (``algorithm`` None, the
    field named as above); with any conflict the document is not to be stored."""
    document: dict[str, Any] = {"name": theirs.get("name")}
    conflicts: list[FieldConflict] = []
    for field in _fields(base, theirs, mine):
        if field == "name":
            continue
        b, t, m = base.get(field), theirs.get(field), mine.get(field)
        if all(isinstance(v, Mapping) or v is None for v in (b, t, m)) and any(v is not None for v in (b, t, m)):
            merged: dict[str, Any] = {}
            parts = (b or {}, t or {}, m or {})
            for key in _fields(*parts):
                value = _merged(*(p.get(key) for p in parts))
                if value is _CLASH:
                    conflicts.append(FieldConflict(None, f"{field}.{key}", *(p.get(key) for p in parts)))
                elif value is not None:
                    merged[key] = value
            if merged:
                document[field] = merged
            continue
        value = _merged(b, t, m)
        if value is _CLASH:
            conflicts.append(FieldConflict(None, field, b, t, m))
        elif value is not None:
            document[field] = value
    return document, conflicts


def _rows(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A document's rows by algorithm, each without its None values (absent and None are one)."""
    return {r["algorithm"]: {k: v for k, v in r.items() if v is not None} for r in document.get("ratings", [])}


def _fields(*rows: Mapping[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(k for k in row if k != "algorithm"))
    return list(seen)


def _plain(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(row) if row is not None else None
