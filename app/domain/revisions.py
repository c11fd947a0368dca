"""Revisions of named documents (rating tables, policies): the rules of going back to one."""

from __future__ import annotations

from app.domain.errors import InvalidInput, StaleRevision

__all__ = ["check_revert", "revert_message"]


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
