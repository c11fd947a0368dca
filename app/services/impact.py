"""An edit's impact on the running tunnels and agent sessions before it is kept: the edit is
made in a unit of work, every running tunnel (:func:`app.services.rekey.assess`) and every
active agent session given (:func:`app.services.agent.target_edits.assess_sessions`) is assessed
against it, and the edit is rolled back.

One function for every dry run: ``?dry_run=true`` on the API's edit routes, ``qoss ratings
edit --dry-run`` and the console's preview of an edit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.domain.agent.ports import AgentSession
from app.domain.ports import UnitOfWork
from app.services.agent.target_edits import SessionImpact, assess_sessions
from app.services.rekey import Impact, assess

__all__ = ["ImpactReport", "preview"]


@dataclass(frozen=True)
class ImpactReport:
    """What an edit would do to each running tunnel and agent session, grouped as an admin reads it."""

    impacts: tuple[Impact, ...]
    #: The agent sessions' (tickets and users).
    sessions: tuple[SessionImpact, ...] = ()

    @property
    def noncompliant(self) -> list[Impact]:
        """The tunnels whose suite would fall below their minimums."""
        return [i for i in self.impacts if i.kind == "noncompliant"]

    @property
    def changed(self) -> list[Impact]:
        """The tunnels still compliant whose choice would be cheaper or otherwise different."""
        return [i for i in self.impacts if i.kind in ("cheaper", "different")]

    @property
    def stays(self) -> int:
        """How many tunnels would keep their suite."""
        return sum(1 for i in self.impacts if i.kind == "stays")

    @property
    def unassessed(self) -> list[Impact]:
        """The tunnels that cannot be assessed (made before provenance was recorded, a gateway gone)."""
        return [i for i in self.impacts if i.kind == "unassessed"]

    def as_list(self) -> list[dict[str, Any]]:
        """Every tunnel's impact as the API answers it."""
        return [i.as_dict() for i in self.impacts]

    def sessions_by_kind(self) -> dict[str, list[SessionImpact]]:
        """The agent sessions grouped as the tunnels are: noncompliant, changed, stays, unassessed."""
        groups: dict[str, list[SessionImpact]] = {"noncompliant": [], "changed": [], "stays": [], "unassessed": []}
        for s in self.sessions:
            groups["changed" if s.kind in ("cheaper", "different") else s.kind].append(s)
        return groups

    def sessions_list(self) -> list[dict[str, Any]]:
        """Every agent session's impact as the API answers it."""
        return [s.as_dict() for s in self.sessions]


def preview(uow: UnitOfWork, *, default_table: str, sessions: Iterable[AgentSession] = ()) -> ImpactReport:
    """The impact of the edit made (and not committed) in ``uow`` on every running tunnel and on
    ``sessions``; then the edit is rolled back, so nothing of it is kept.

    Args:
        uow: the unit of work holding the uncommitted edit; rolled back on return.
        default_table: the service's default rating table (for tunnels negotiated on it).
        sessions: the active agent sessions of the Target whose database ``uow`` is
            (:func:`app.services.agent.target_edits.active_sessions`).
    """
    try:
        return ImpactReport(tuple(assess(uow, default_table=default_table)),
                            tuple(assess_sessions(uow, sessions, default_table=default_table)))
    finally:
        uow.rollback()
