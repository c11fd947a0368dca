"""The live event log: what a token may see of it, from a point on."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.ports import UnitOfWork

__all__ = ["events_after", "last_event_id", "prune_events", "visible_scopes"]


def visible_scopes(scopes: Collection[str]) -> frozenset[str] | None:
    """The event scopes a token with ``scopes`` sees (None: all of them, for ``admin``)."""
    return None if "admin" in scopes else frozenset(scopes)


def events_after(uow: UnitOfWork, last_id: int, scopes: Collection[str] | None, limit: int = 500
                 ) -> list[dict[str, Any]]:
    """Events newer than ``last_id``, oldest first, that ``scopes`` may see."""
    return uow.events.after(last_id, scopes=scopes, limit=limit)


def last_event_id(uow: UnitOfWork) -> int:
    return uow.events.last_id()


def prune_events(uow: UnitOfWork, keep_days: float) -> int:
    """Forget events older than ``keep_days`` days; how many."""
    return uow.events.prune(datetime.now(UTC) - timedelta(days=keep_days))
