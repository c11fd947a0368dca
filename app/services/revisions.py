"""What rating tables and policies share as revisioned documents: going back to a past
revision, and the shipped documents offered to a database once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from app.domain.errors import NotFound
from app.domain.ports import RevisionedStore, ShippedLoadStore, UnitOfWork
from app.domain.revisions import check_revert, revert_message

__all__ = ["load_shipped", "restore_shipped", "revert", "tell"]

D = TypeVar("D")


def revert(store: RevisionedStore[D], *, name: str, revision: int, expected_revision: int, author: str,
           message: str | None = None) -> tuple[D, int]:
    """Go back to a past revision: a new revision whose content is revision ``revision``'s.

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
    return past, new


def load_shipped(store: RevisionedStore[D], shipped: ShippedLoadStore, *, kind: str, documents: Sequence[D],
                 name_of: Callable[[D], str], author: str, message: str) -> list[str]:
    """Insert the shipped documents this database was never offered; returns the names inserted.

    Each shipped name is offered once: afterwards it is recorded, so a document an operator
    deleted stays deleted (:func:`restore_shipped` brings one back on purpose), and one of
    that name made by someone else is never overwritten.
    """
    offered = shipped.loaded(kind)
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
        shipped.record(kind, name)
    return added


def restore_shipped(store: RevisionedStore[D], shipped: ShippedLoadStore, *, kind: str, noun: str,
                    documents: Sequence[D], name_of: Callable[[D], str], name: str, author: str,
                    message: str) -> tuple[D, int]:
    """Insert the shipped document ``name`` again (after it was deleted), at revision 1.

    Raises:
        NotFound: no shipped document has that name.
        AlreadyExists: the database has one of that name.
    """
    document = next((d for d in documents if name_of(d) == name), None)
    if document is None:
        raise NotFound(f"no shipped {noun} is called {name!r}; shipped: {sorted(name_of(d) for d in documents)}")
    revision = store.create(document, author=author, message=message)
    shipped.record(kind, name)
    return document, revision


def tell(uow: UnitOfWork, kind: str, name: str, revision: int | None, author: str) -> None:
    """The event of a new revision (``revision``) or a deletion (None) of a rating table or policy."""
    uow.events.append(f"{kind}.{'revision' if revision is not None else 'deleted'}", name,
                      {"revision": revision, "author": author})
