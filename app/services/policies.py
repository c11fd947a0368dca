"""Use cases for policies: CRUD with revisions, and loading the shipped ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from app.adapters.db.repositories import PolicyRepository
from app.domain.errors import InvalidPolicy, NotFound
from app.domain.policies import Policy

__all__ = [
    "create_policy",
    "delete_policy",
    "get_policy",
    "list_policies",
    "load_shipped_policies",
    "policy_revisions",
    "replace_policy",
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


def delete_policy(*, session: Session, name: str) -> None:
    """Delete a policy."""
    PolicyRepository(session).delete(name)


def policy_revisions(*, session: Session, name: str) -> list[dict[str, Any]]:
    """A policy's history."""
    return PolicyRepository(session).revisions(name)


def load_shipped_policies(*, session: Session, policies: list[Policy], author: str = "shipped") -> list[str]:
    """Insert the shipped policies the database does not have yet."""
    repo = PolicyRepository(session)
    added = []
    for policy in policies:
        try:
            repo.get(policy.name)
        except NotFound:
            repo.create(policy, author=author)
            added.append(policy.name)
    return added
