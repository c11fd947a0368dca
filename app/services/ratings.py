"""Use cases for rating tables: list, read, edit with revisions, import and export.

Services never commit: the caller's unit of work does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.domain.algorithms import resolve
from app.domain.errors import Conflict, InvalidRatingTable, StaleRevision
from app.domain.merge import merge_tables
from app.domain.ports import UnitOfWork
from app.domain.ratings import Rating, RatingTable
from app.services.revisions import load_shipped, restore_shipped, revert, save_merged, tell

__all__ = [
    "create_table",
    "delete_table",
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


def list_tables(*, uow: UnitOfWork) -> list[dict[str, Any]]:
    """Summaries of every table."""
    return uow.tables.list()


def get_table(*, uow: UnitOfWork, name: str) -> RatingTable:
    """The current revision of one table."""
    return uow.tables.get(name)


def table_revision(*, uow: UnitOfWork, name: str, revision: int) -> RatingTable:
    """One past revision of a table."""
    return uow.tables.get_revision(name, revision)


def table_revisions(*, uow: UnitOfWork, name: str) -> list[dict[str, Any]]:
    """The history of a table: who changed what, when."""
    return uow.tables.revisions(name)


def revert_table(*, uow: UnitOfWork, name: str, revision: int, expected_revision: int, author: str,
                 message: str | None = None) -> RatingTable:
    """Go back to a past revision of a table (see :func:`app.services.revisions.revert`)."""
    past, new = revert(uow, uow.tables, kind="rating_table", name=name, revision=revision,
                       expected_revision=expected_revision, author=author, message=message)
    return past.at_revision(new)


def create_table(*, uow: UnitOfWork, document: Mapping[str, Any], author: str) -> RatingTable:
    """Create a table from its document form."""
    table = RatingTable.from_dict(document)
    revision = uow.tables.create(table, author=author, message="created")
    tell(uow, "rating_table", table.name, revision, author)
    return table.at_revision(revision)


def replace_table(
    *, uow: UnitOfWork, name: str, document: Mapping[str, Any], expected_revision: int, author: str,
    message: str = "replaced",
) -> RatingTable:
    """Replace a whole table; ``expected_revision`` must be the current one."""
    body_name = document.get("name") if isinstance(document, Mapping) else None
    if body_name is not None and body_name != name:
        raise InvalidRatingTable(f"the body names table {str(body_name)[:64]!r} but the path names {name!r}")
    table = RatingTable.from_dict(document, name=name)
    revision = uow.tables.update(
        table, expected_revision=expected_revision, author=author, message=message
    )
    tell(uow, "rating_table", name, revision, author)
    return table.at_revision(revision)


def update_rating(
    *, uow: UnitOfWork, name: str, algorithm: str, changes: Mapping[str, Any], expected_revision: int,
    author: str,
) -> RatingTable:
    """Edit (or add) one algorithm's row; fields not given keep their value.

    The edit is made on revision ``expected_revision`` (If-Match). If others saved since, it is
    merged over the latest revision (:func:`app.domain.merge.merge_tables`): it lands as a new
    revision on top of theirs when none of the values it changes was changed since to another
    value; an edit already in the latest revision (the same values) lands as that revision,
    nothing written.

    Raises:
        EditConflict: a value the edit changes was changed since to another value (nothing written).
        StaleRevision: ``expected_revision`` is not a revision of the table.
        InvalidRatingTable: the edited row is not valid.
    """
    repo = uow.tables
    current = repo.current_revision(name)
    keyword = resolve(algorithm)
    if "algorithm" in changes and resolve(str(changes["algorithm"])) != keyword:
        raise InvalidRatingTable("the body's algorithm differs from the path's")
    if not 1 <= expected_revision <= current:
        raise StaleRevision(name, expected_revision, current)
    # The revision the client edited, read by its number: another writer may have committed a
    # newer one since ``current`` was read, and the edit must be merged over theirs, not made on it.
    base = repo.get_revision(name, expected_revision)
    mine = base.with_rating(_edited_row(base, keyword, changes))
    table, revision = save_merged(uow, repo, kind="rating_table", name=name, base=base, mine=mine,
                                  expected_revision=expected_revision, current=current, author=author,
                                  message=f"edited {keyword}", merge=merge_tables,
                                  read=lambda document: RatingTable.from_dict(document, name=name))
    return table.at_revision(revision)


def _edited_row(table: RatingTable, keyword: str, changes: Mapping[str, Any]) -> Rating:
    """``keyword``'s row of ``table`` with ``changes`` (a None value removes the field)."""
    current = table.get(keyword)
    before = current.as_dict() if current is not None else {}
    row = {k: v for k, v in {**before, **changes, "algorithm": keyword}.items() if v is not None}
    return Rating.from_dict(row, f"ratings[{keyword}]")


def delete_table(*, uow: UnitOfWork, name: str, default_table: str) -> None:
    """Delete a table; the service's default table cannot be deleted."""
    if name == default_table:
        raise Conflict(f"{name} is the service's default rating table and cannot be deleted")
    uow.tables.delete(name)
    tell(uow, "rating_table", name, None, "")


def import_table(*, uow: UnitOfWork, table: RatingTable, fmt: str, author: str,
                 expected_revision: int | None = None) -> RatingTable:
    """Store an imported table (read from YAML or CSV by the caller): a new table, or a new
    revision with ``expected_revision``. CSV holds the rows only: a new revision from CSV keeps the
    table's description and source."""
    if fmt == "csv" and expected_revision is not None and not (table.description or table.source):
        current = uow.tables.get(table.name)
        table = RatingTable(name=table.name, ratings=table.ratings, description=current.description,
                            source=current.source, revision=table.revision)
    if expected_revision is None:
        revision = uow.tables.create(table, author=author, message=f"imported ({fmt})")
    else:
        revision = uow.tables.update(table, expected_revision=expected_revision, author=author,
                                     message=f"imported ({fmt})")
    tell(uow, "rating_table", table.name, revision, author)
    return table.at_revision(revision)


#: The kind under which shipped rating tables are recorded as loaded.
SHIPPED_KIND = "rating_table"


def load_shipped_tables(*, uow: UnitOfWork, tables: list[RatingTable], author: str = "shipped") -> list[str]:
    """Insert the shipped tables this database was never offered, each name once
    (see :func:`app.services.revisions.load_shipped`); returns the names inserted."""
    return load_shipped(uow, uow.tables, kind=SHIPPED_KIND, documents=tables, name_of=_name,
                        author=author, message="loaded from ratings/")


def restore_shipped_table(*, uow: UnitOfWork, tables: list[RatingTable], name: str,
                          author: str = "shipped") -> RatingTable:
    """Insert the shipped table ``name`` again (after it was deleted), at revision 1.

    Raises:
        NotFound: no shipped table has that name.
        AlreadyExists: the database has a table of that name.
    """
    table, revision = restore_shipped(uow, uow.tables, kind=SHIPPED_KIND, noun="rating table", documents=tables,
                                      name_of=_name, name=name, author=author, message="restored from ratings/")
    return table.at_revision(revision)


def _name(table: RatingTable) -> str:
    return table.name
