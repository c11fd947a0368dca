"""What the agent store's contract tests share: the store of every kind, and calls made at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.adapters.db.agent_store import SqlAgentStore
from app.domain.agent.ports import AgentStore
from tests.contract.databases import migrated_sessions
from tests.fakes.agent_store import FakeAgentStore

__all__ = ["at_once", "store"]


@pytest.fixture(params=["fake", "sqlite", "sqlite-public", pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("postgresql-public", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentStore]:
    """An agent store on an empty, migrated database of each kind; ``-public``: with fast paths
    off, its hot statements on SQLAlchemy's public path."""
    if request.param == "fake":
        yield FakeAgentStore()
        return
    kind, _, public = request.param.partition("-")
    with migrated_sessions(kind, tmp_path, fast_paths=not public) as sessions:
        yield SqlAgentStore(sessions)


def at_once(count: int, act: Callable[[int], None]) -> None:
    """``act(0)`` to ``act(count - 1)``, each in a thread of its own, all let go together; each
    thread is waited for up to a minute."""
    barrier = threading.Barrier(count)

    def run(n: int) -> None:
        barrier.wait()
        act(n)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
