"""Use cases for rating tables: list, read, edit with revisions, import and export.

Services never commit: the caller's unit of work (the request-scoped session) does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from app.adapters import files
from app.adapters.db.repositories import RatingTableRepository, ShippedLoadRepository
from app.domain.algorithms import resolve
from app.domain.errors import Conflict, InvalidRatingTable, NotFound, StaleRevision
from app.domain.ratings import Rating, RatingTable
from app.domain.revisions import check_revert, revert_message

__all__ = [
    "TableCache",
    "create_table",
    "delete_table",
    "export_table",
    "get_table",
    "import_table",
    "list_tables",
    "load_shipped_tables",
    "replace_table",
    "restore_shipped_table",
    "revert_table",
    "table_revision",
    "table_revisions",
    "update_rating",
]


class TableCache:
    """Parsed rating tables by (name, revision).

    A table's current revision is read from the database at most once per ``ttl``
    seconds per table, so a negotiation normally costs no query at all. Edits through
    this process invalidate the entry at once; an edit made by another replica is seen
    within ``ttl`` (bounded staleness, documented in the README).
    """

    def __init__(self, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, tuple[RatingTable, float]] = {}
        self._ttl = ttl
        self._clock = clock

    def get(self, session: Session, name: str) -> RatingTable:
        now = self._clock()
        with self._lock:
            cached = self._tables.get(name)
        if cached is not None and now - cached[1] < self._ttl:
            return cached[0]
        repo = RatingTableRepository(session)
        revision = repo.current_revision(name)
        table = cached[0] if cached is not None and cached[0].revision == revision else repo.get(name)
        with self._lock:
            self._tables[name] = (table, now)
        return table

    def invalidate(self, name: str) -> None:
        """Forget one table (after this process changed it)."""
        with self._lock:
            self._tables.pop(name, None)


def list_tables(*, session: Session) -> list[dict[str, Any]]:
    """Summaries of every table."""
    return RatingTableRepository(session).list()


def get_table(*, session: Session, name: str) -> RatingTable:
    """The current revision of one table."""
    return RatingTableRepository(session).get(name)


def table_revision(*, session: Session, name: str, revision: int) -> RatingTable:
    """One past revision of a table."""
    return RatingTableRepository(session).get_revision(name, revision)


def table_revisions(*, session: Session, name: str) -> list[dict[str, Any]]:
    """The history of a table: who changed what, when."""
    return RatingTableRepository(session).revisions(name)


def revert_table(*, session: Session, name: str, revision: int, expected_revision: int, author: str,
                 message: str | None = None) -> RatingTable:
    """Go back to a past revision: a new revision whose content is revision ``revision``'s.

    History is kept: the new revision's message is "reverted to N" (and ``message``).

    Raises:
        NotFound: no such table, or no such revision of it.
        StaleRevision: ``expected_revision`` is not the current revision.
        InvalidInput: ``revision`` is the current revision (nothing to revert).
    """
    repo = RatingTableRepository(session)
    check_revert(name, revision, expected_revision, repo.current_revision(name))
    past = repo.get_revision(name, revision)
    new = repo.update(past, expected_revision=expected_revision, author=author,
                      message=revert_message(revision, message))
    return RatingTable.from_dict(past.as_dict(), revision=new)


def create_table(*, session: Session, document: Mapping[str, Any], author: str) -> RatingTable:
    """Create a table from its document form."""
    table = RatingTable.from_dict(document)
    revision = RatingTableRepository(session).create(table, author=author, message="created")
    return RatingTable.from_dict(table.as_dict(), revision=revision)


def replace_table(
    *, session: Session, name: str, document: Mapping[str, Any], expected_revision: int, author: str,
    message: str = "replaced",
) -> RatingTable:
    """Replace a whole table; ``expected_revision`` must be the current one."""
    body_name = document.get("name") if isinstance(document, Mapping) else None
    if body_name is not None and body_name != name:
        raise InvalidRatingTable(f"the body names table {str(body_name)[:64]!r} but the path names {name!r}")
    table = RatingTable.from_dict(document, name=name)
    revision = RatingTableRepository(session).update(
        table, expected_revision=expected_revision, author=author, message=message
    )
    return RatingTable.from_dict(table.as_dict(), revision=revision)


def update_rating(
    *, session: Session, name: str, algorithm: str, changes: Mapping[str, Any], expected_revision: int,
    author: str,
) -> RatingTable:
    """Edit (or add) one algorithm's row; fields not given keep their value."""
    repo = RatingTableRepository(session)
    table = repo.get(name)
    if table.revision != expected_revision:
        raise StaleRevision(name, expected_revision, table.revision)
    keyword = resolve(algorithm)
    if "algorithm" in changes and resolve(str(changes["algorithm"])) != keyword:
        raise InvalidRatingTable("the body's algorithm differs from the path's")
    current = table.get(keyword)
    base = current.as_dict() if current is not None else {}
    merged = {k: v for k, v in {**base, **changes, "algorithm": keyword}.items() if v is not None}
    rating = Rating.from_dict(merged, f"ratings[{keyword}]")
    updated = table.with_rating(rating)
    revision = repo.update(updated, expected_revision=expected_revision, author=author,
                           message=f"edited {keyword}")
    return RatingTable.from_dict(updated.as_dict(), revision=revision)


def delete_table(*, session: Session, name: str, default_table: str) -> None:
    """Delete a table; the service's default table cannot be deleted."""
    if name == default_table:
        raise Conflict(f"{name} is the service's default rating table and cannot be deleted")
    RatingTableRepository(session).delete(name)


def import_table(
    *, session: Session, text: str, fmt: str, author: str, name: str | None = None,
    expected_revision: int | None = None, description: str = "", source: str = "",
) -> RatingTable:
    """Import a table from YAML or CSV: a new table, or a new revision with ``expected_revision``."""
    if fmt == "yaml":
        table = files.parse_rating_table_yaml(text, name=name)
    elif fmt == "csv":
        if not name:
            raise InvalidRatingTable("a CSV import needs the table's name")
        table = files.parse_rating_table_csv(text, name=name, description=description, source=source)
    else:
        raise InvalidRatingTable("format must be 'yaml' or 'csv'")
    repo = RatingTableRepository(session)
    if expected_revision is None:
        revision = repo.create(table, author=author, message=f"imported ({fmt})")
    else:
        revision = repo.update(table, expected_revision=expected_revision, author=author,
                               message=f"imported ({fmt})")
    return RatingTable.from_dict(table.as_dict(), revision=revision)


def export_table(*, session: Session, name: str, fmt: str) -> str:
    """A table as YAML or CSV text."""
    table = RatingTableRepository(session).get(name)
    if fmt == "yaml":
        return files.dump_rating_table_yaml(table)
    if fmt == "csv":
        return files.dump_rating_table_csv(table)
    raise InvalidRatingTable("format must be 'yaml' or 'csv'")


#: The kind under which shipped rating tables are recorded as loaded.
SHIPPED_KIND = "rating_table"


def load_shipped_tables(*, session: Session, tables: list[RatingTable], author: str = "shipped") -> list[str]:
    """Insert the shipped tables this database was never offered; returns the names inserted.

    Each shipped name is offered once: afterwards it is recorded, so a table an operator
    deleted stays deleted (:func:`restore_shipped_table` brings one back on purpose), and
    a table of that name made by someone else is never overwritten.
    """
    repo = RatingTableRepository(session)
    loads = ShippedLoadRepository(session)
    offered = loads.loaded(SHIPPED_KIND)
    added = []
    for table in tables:
        if table.name in offered:
            continue
        try:
            repo.current_revision(table.name)
        except NotFound:
            repo.create(table, author=author, message="loaded from ratings/")
            added.append(table.name)
        loads.record(SHIPPED_KIND, table.name)
    return added


def restore_shipped_table(*, session: Session, tables: list[RatingTable], name: str,
                          author: str = "shipped") -> RatingTable:
    """Insert the shipped table ``name`` again (after it was deleted), at revision 1.

    Raises:
        NotFound: no shipped table has that name.
        AlreadyExists: the database has a table of that name.
    """
    shipped = next((t for t in tables if t.name == name), None)
    if shipped is None:
        raise NotFound(f"no shipped rating table is called {name!r}; shipped: {sorted(t.name for t in tables)}")
    revision = RatingTableRepository(session).create(shipped, author=author, message="restored from ratings/")
    ShippedLoadRepository(session).record(SHIPPED_KIND, name)
    return RatingTable.from_dict(shipped.as_dict(), revision=revision)
