"""What rating tables and policies share as revisioned documents: an edit made on an older
revision merged over the latest, going back to a past revision, and the shipped documents
offered to a database once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from app.domain.errors import EditConflict, NotFound, StaleRevision
from app.domain.merge import FieldConflict
from app.domain.ports import RevisionedStore, UnitOfWork
from app.domain.revisions import check_revert, revert_message

__all__ = ["load_shipped", "restore_shipped", "revert", "save_merged", "tell"]


class _Document(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


D = TypeVar("D")
R = TypeVar("R", bound=_Document)

#: Merges an edit (mine, made on base) over the latest revision (theirs), as documents.
Merge = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
                 tuple[dict[str, Any], list[FieldConflict]]]

#: How many times an edit is merged again over a write that came first before it is refused.
MERGE_ATTEMPTS = 10


def save_merged(uow: UnitOfWork, store: RevisionedStore[R], *, kind: str, name: str, base: R, mine: R,
                expected_revision: int, current: int, author: str, message: str, merge: Merge,
                read: Callable[[dict[str, Any]], R]) -> tuple[R, int]:
    """Store ``mine``, an edit made on revision ``expected_revision`` (``base``), as a new revision.

    When ``current`` is that revision, ``mine`` is stored as it is, with ``message``. Otherwise
    the edit is merged over the latest revision with ``merge`` and stored when nothing clashes
    ("``message`` (made on revision N, merged)"); an edit already in the latest revision is
    answered with that revision, nothing written. Another write landing first is merged over
    in turn, up to :data:`MERGE_ATTEMPTS` times. A stored revision is told (:func:`tell`).

    Args:
        kind: ``"rating_table"`` or ``"policy"``: the event's kind, and what a conflict names.
        read: a merged document back into the store's kind of document (validated).

    Returns:
        The document stored (or found in the latest revision) and its revision.

    Raises:
        EditConflict: a value the edit changes was changed since to another value.
        StaleRevision: other writes kept coming first.
    """
    for _ in range(MERGE_ATTEMPTS):
        if current == expected_revision:
            updated, note = mine, message
        else:
            latest = store.get_revision(name, current)
            document, conflicts = merge(base.as_dict(), latest.as_dict(), mine.as_dict())
            if conflicts:
                raise EditConflict(name, expected_revision, current, [c.as_dict() for c in conflicts],
                                   kind="table" if kind == "rating_table" else kind)
            updated = read(document)
            if updated.as_dict() == latest.as_dict():
                return latest, current  # the edit is in the latest revision already
            note = f"{message} (made on revision {expected_revision}, merged)"
        try:
            revision = store.update(updated, expected_revision=current, author=author, message=note)
        except StaleRevision as exc:  # another write came first: merge over that one
            current = exc.current if exc.current > current else store.current_revision(name)
            continue
        tell(uow, kind, name, revision, author)
        return updated, revision
    raise StaleRevision(name, expected_revision, store.current_revision(name))


def revert(uow: UnitOfWork, store: RevisionedStore[D], *, kind: str, name: str, revision: int,
           expected_revision: int, author: str, message: str | None = None) -> tuple[D, int]:
    """Go back to a past revision: a new revision whose content is revision ``revision``'s, told
    as ``kind`` (:func:`tell`).

    History is kept: the new revision's message is "reverted to N" (and ``message``).

    Returns:
        The past document and the new revision's number.

    Raises:
        NotFound: no such document, or no such revision of it.
        StaleRevision: ``expected_revision`` is not the current revision.
        InvalidInput: ``revision`` is the current revision (nothing to revert).
    """
    check_revert(name, revision, expected_revision, store.current_revision(name))
    past = store.get_revision(name, revision)
    new = store.update(past, expected_revision=expected_revision, author=author,
                       message=revert_message(revision, message))
    tell(uow, kind, name, new, author)
    return past, new


def load_shipped(uow: UnitOfWork, store: RevisionedStore[D], *, kind: str, documents: Sequence[D],
                 name_of: Callable[[D], str], author: str, message: str) -> list[str]:
    """Insert the shipped documents this database was never offered; returns the names inserted.

    Each shipped name is offered once: afterwards it is recorded, so a document an operator
    deleted stays deleted (:func:`restore_shipped` brings one back on purpose), and one of
    that name made by someone else is never overwritten.
    """
    offered = uow.shipped.loaded(kind)
    added = []
    for document in documents:
        name = name_of(document)
        if name in offered:
            continue
        try:
            store.current_revision(name)
        except NotFound:
            store.create(document, author=author, message=message)
            added.append(name)
        uow.shipped.record(kind, name)
    return added


def restore_shipped(uow: UnitOfWork, store: RevisionedStore[D], *, kind: str, noun: str,
                    documents: Sequence[D], name_of: Callable[[D], str], name: str, author: str,
                    message: str) -> tuple[D, int]:
    """Insert the shipped document ``name`` again (after it was deleted), at revision 1, told as
    ``kind`` (:func:`tell`).

    Raises:
        NotFound: no shipped document has that name.
        AlreadyExists: the database has one of that name.
    """
    document = next((d for d in documents if name_of(d) == name), None)
    if document is None:
        raise NotFound(f"no shipped {noun} is called {name!r}; shipped: {sorted(name_of(d) for d in documents)}")
    revision = store.create(document, author=author, message=message)
    uow.shipped.record(kind, name)
    tell(uow, kind, name, revision, author)
    return document, revision


def tell(uow: UnitOfWork, kind: str, name: str, revision: int | None, author: str) -> None:
    """The event of a new revision (``revision``) or a deletion (None) of a rating table or policy."""
    uow.events.append(f"{kind}.{'revision' if revision is not None else 'deleted'}", name,
                      {"revision": revision, "author": author})
