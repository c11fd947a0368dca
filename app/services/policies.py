"""Use cases for policies: CRUD with revisions, and loading the shipped ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from app.adapters.db.repositories import PolicyRepository, ShippedLoadRepository
from app.domain.errors import InvalidPolicy, NotFound
from app.domain.policies import Policy
from app.domain.revisions import check_revert, revert_message

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


def list_policies(*, session: Session) -> list[dict[str, Any]]:
    """Summaries of every stored policy."""
    return PolicyRepository(session).list()


def get_policy(*, session: Session, name: str) -> tuple[Policy, int]:
    """A policy and its current revision."""
    return PolicyRepository(session).get(name)


def create_policy(*, session: Session, document: Mapping[str, Any], author: str) -> tuple[Policy, int]:
    """Store a new policy."""
    policy = Policy.from_dict(document)
    revision = PolicyRepository(session).create(policy, author=author)
    return policy, revision


def replace_policy(
    *, session: Session, name: str, document: Mapping[str, Any], expected_revision: int, author: str
) -> tuple[Policy, int]:
    """Replace a policy; ``expected_revision`` must be the current one."""
    body_name = document.get("name") if isinstance(document, Mapping) else None
    if body_name is not None and body_name != name:
        raise InvalidPolicy(f"the body names policy {str(body_name)[:64]!r} but the path names {name!r}")
    policy = Policy.from_dict(document, name=name)
    revision = PolicyRepository(session).update(policy, expected_revision=expected_revision, author=author)
    return policy, revision


def revert_policy(*, session: Session, name: str, revision: int, expected_revision: int, author: str,
                  message: str | None = None) -> tuple[Policy, int]:
    """Go back to a past revision of a policy, as :func:`app.services.ratings.revert_table` does
    for a table: a new revision with revision ``revision``'s content, "reverted to N".

    Raises:
        NotFound: no such policy, or no such revision of it.
        StaleRevision: ``expected_revision`` is not the current revision.
        InvalidInput: ``revision`` is the current revision.
    """
    repo = PolicyRepository(session)
    check_revert(name, revision, expected_revision, repo.current_revision(name))
    past = repo.get_revision(name, revision)
    new = repo.update(past, expected_revision=expected_revision, author=author,
                      message=revert_message(revision, message))
    return past, new


def delete_policy(*, session: Session, name: str) -> None:
    """Delete a policy."""
    PolicyRepository(session).delete(name)


def policy_revisions(*, session: Session, name: str) -> list[dict[str, Any]]:
    """A policy's history."""
    return PolicyRepository(session).revisions(name)


#: The kind under which shipped policies are recorded as loaded.
SHIPPED_KIND = "policy"


def load_shipped_policies(*, session: Session, policies: list[Policy], author: str = "shipped") -> list[str]:
    """Insert the shipped policies this database was never offered; returns the names inserted.

    Each shipped name is offered once (see :func:`app.services.ratings.load_shipped_tables`).
    """
    repo = PolicyRepository(session)
    loads = ShippedLoadRepository(session)
    offered = loads.loaded(SHIPPED_KIND)
    added = []
    for policy in policies:
        if policy.name in offered:
            continue
        try:
            repo.get(policy.name)
        except NotFound:
            repo.create(policy, author=author)
            added.append(policy.name)
        loads.record(SHIPPED_KIND, policy.name)
    return added


def restore_shipped_policy(*, session: Session, policies: list[Policy], name: str,
                           author: str = "shipped") -> tuple[Policy, int]:
    """Insert the shipped policy ``name`` again (after it was deleted), at revision 1.

    Raises:
        NotFound: no shipped policy has that name.
        AlreadyExists: the database has a policy of that name.
    """
    shipped = next((p for p in policies if p.name == name), None)
    if shipped is None:
        raise NotFound(f"no shipped policy is called {name!r}; shipped: {sorted(p.name for p in policies)}")
    revision = PolicyRepository(session).create(shipped, author=author, message="restored from policies/")
    ShippedLoadRepository(session).record(SHIPPED_KIND, name)
    return shipped, revision
