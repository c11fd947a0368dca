"""An edit is made on the revision its If-Match names, whatever is current when it is read.

Between reading a table's (or policy's) current revision number and reading its content, another
writer may commit a new revision (on PostgreSQL each statement sees what is committed by then).
The edit must still be compared with the revision the client edited: a value the other writer
changed to something else is a conflict (409), and a value it did not touch is merged over its
revision. Here the other writer commits first and the edit's reading of the current revision
is made to answer the revision before it, as it would have a moment earlier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.repositories.revisioned import PolicyRepository, RatingTableRepository
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.domain.errors import EditConflict
from app.domain.policies import Policy
from app.domain.ratings import Rating, RatingTable
from app.services import policies, ratings

TABLE = RatingTable.of("t", [Rating("aes128", confidentiality=8, performance=8),
                             Rating("sha1", integrity=5, performance=6)])
POLICY = {"name": "p", "min_levels": {"confidentiality": 8, "integrity": 4}, "objective_id": 3}


def _unit(session_factory: sessionmaker[Session]) -> SqlUnitOfWork:
    return SqlUnitOfWork(session_factory(), owned=True)


def _read_one_revision_late(monkeypatch: pytest.MonkeyPatch, repository: type[Any]) -> None:
    """The next ``current_revision`` answers one less than the database holds now (once)."""
    real: Callable[[Any, str], int] = repository.current_revision
    calls = [0]

    def late(self: Any, name: str) -> int:
        calls[0] += 1
        return real(self, name) - (1 if calls[0] == 1 else 0)

    monkeypatch.setattr(repository, "current_revision", late)


def test_a_rating_edit_read_before_anothers_commit_conflicts_with_it(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _unit(session_factory) as uow:
        uow.tables.create(TABLE, author="setup")
        uow.commit()
    with _unit(session_factory) as uow:  # the other writer: aes128's performance 8 -> 1.0
        ratings.update_rating(uow=uow, name="t", algorithm="aes128", changes={"performance": 1.0},
                              expected_revision=1, author="other")
        uow.commit()
    _read_one_revision_late(monkeypatch, RatingTableRepository)
    with _unit(session_factory) as uow, pytest.raises(EditConflict):  # made on revision 1: 8 -> 2.5
        ratings.update_rating(uow=uow, name="t", algorithm="aes128", changes={"performance": 2.5},
                              expected_revision=1, author="late")
    with _unit(session_factory) as uow:
        table = uow.tables.get("t")
    assert (table.revision, table.get("aes128").performance) == (2, 1.0)  # type: ignore[union-attr]


def test_a_policy_edit_read_before_anothers_commit_is_merged_over_it(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _unit(session_factory) as uow:
        policies.create_policy(uow=uow, document=POLICY, author="setup")
        uow.commit()
    with _unit(session_factory) as uow:  # the other writer raises confidentiality
        policies.replace_policy(uow=uow, name="p", document={**POLICY, "min_levels": {
            "confidentiality": 9, "integrity": 4}}, expected_revision=1, author="other")
        uow.commit()
    _read_one_revision_late(monkeypatch, PolicyRepository)
    with _unit(session_factory) as uow:  # made on revision 1: only the objective changes
        policy, revision = policies.replace_policy(uow=uow, name="p", document={**POLICY, "objective_id": 4},
                                                   expected_revision=1, author="late")
        uow.commit()
    assert revision == 3
    with _unit(session_factory) as uow:
        stored, current = uow.policies.get("p")
    assert current == 3
    assert stored == policy
    assert stored == Policy.from_dict({**POLICY, "min_levels": {"confidentiality": 9, "integrity": 4},
                                       "objective_id": 4})
