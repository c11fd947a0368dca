"""Use cases for policies: CRUD with revisions, and loading the shipped ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.domain.errors import InvalidPolicy, StaleRevision
from app.domain.merge import merge_policies
from app.domain.policies import Policy
from app.domain.ports import UnitOfWork
from app.services.revisions import load_shipped, restore_shipped, revert, save_merged, tell

__all__ = [
    "create_policy",
    "delete_policy",
    "get_policy",
    "list_policies",
    "load_shipped_policies",
    "policy_revisions",
    "replace_policy",
    "restore_shipped_policy",
    "revert_policy",
]


def list_policies(*, uow: UnitOfWork) -> list[dict[str, Any]]:
    """Summaries of every stored policy."""
    return uow.policies.list()


def get_policy(*, uow: UnitOfWork, name: str) -> tuple[Policy, int]:
    """A policy and its current revision."""
    return uow.policies.get(name)


def create_policy(*, uow: UnitOfWork, document: Mapping[str, Any], author: str) -> tuple[Policy, int]:
    """Store a new policy."""
    policy = Policy.from_dict(document)
    revision = uow.policies.create(policy, author=author)
    tell(uow, "policy", policy.name, revision, author)
    return policy, revision


def replace_policy(
    *, uow: UnitOfWork, name: str, document: Mapping[str, Any], expected_revision: int, author: str
) -> tuple[Policy, int]:
    """Replace a policy, as edited on revision ``expected_revision`` (If-Match).

    If others saved since, the edit is merged over the latest revision field by field
    (:func:`app.domain.merge.merge_policies`, as a table's rows are): it lands as a new revision
    when none of the values it changes was changed since to another value; an edit already in
    the latest revision lands as that revision, nothing written.

    Raises:
        EditConflict: a value the edit changes was changed since to another value (nothing written).
        StaleRevision: ``expected_revision`` is not a revision of the policy.
        InvalidPolicy: the document is not a valid policy.
    """
    body_name = document.get("name") if isinstance(document, Mapping) else None
    if body_name is not None and body_name != name:
        raise InvalidPolicy(f"the body names policy {str(body_name)[:64]!r} but the path names {name!r}")
    mine = Policy.from_dict(document, name=name)
    repo = uow.policies
    current = repo.current_revision(name)
    if not 1 <= expected_revision <= current:
        raise StaleRevision(name, expected_revision, current)
    # The revision the client edited, read by its number even when it is ``current``: another
    # writer may commit a newer one before this one, and the edit is then merged over theirs.
    base = repo.get_revision(name, expected_revision)
    return save_merged(uow, repo, kind="policy", name=name, base=base, mine=mine,
                       expected_revision=expected_revision, current=current, author=author, message="replaced",
                       merge=merge_policies, read=lambda document: Policy.from_dict(document, name=name))


def revert_policy(*, uow: UnitOfWork, name: str, revision: int, expected_revision: int, author: str,
                  message: str | None = None) -> tuple[Policy, int]:
    """Go back to a past revision of a policy, as :func:`app.services.ratings.revert_table` does
    for a table: a new revision with revision ``revision``'s content, "reverted to N".

    Raises:
        NotFound: no such policy, or no such revision of it.
        StaleRevision: ``expected_revision`` is not the current revision.
        InvalidInput: ``revision`` is the current revision.
    """
    return revert(uow, uow.policies, kind="policy", name=name, revision=revision,
                  expected_revision=expected_revision, author=author, message=message)


def delete_policy(*, uow: UnitOfWork, name: str) -> None:
    """Delete a policy."""
    uow.policies.delete(name)
    tell(uow, "policy", name, None, "")


def policy_revisions(*, uow: UnitOfWork, name: str) -> list[dict[str, Any]]:
    """A policy's history."""
    return uow.policies.revisions(name)


#: The kind under which shipped policies are recorded as loaded.
SHIPPED_KIND = "policy"


def load_shipped_policies(*, uow: UnitOfWork, policies: list[Policy], author: str = "shipped") -> list[str]:
    """Insert the shipped policies this database was never offered, each name once
    (see :func:`app.services.revisions.load_shipped`); returns the names inserted."""
    return load_shipped(uow, uow.policies, kind=SHIPPED_KIND, documents=policies, name_of=_name,
                        author=author, message="created")


def restore_shipped_policy(*, uow: UnitOfWork, policies: list[Policy], name: str,
                           author: str = "shipped") -> tuple[Policy, int]:
    """Insert the shipped policy ``name`` again (after it was deleted), at revision 1.

    Raises:
        NotFound: no shipped policy has that name.
        AlreadyExists: the database has a policy of that name.
    """
    return restore_shipped(uow, uow.policies, kind=SHIPPED_KIND, noun="policy", documents=policies,
                           name_of=_name, name=name, author=author, message="restored from policies/")


def _name(policy: Policy) -> str:
    return policy.name
