"""One leader among replicas sharing a database (app.adapters.db.leader), on real PostgreSQL
and SQLite: exactly one leads, and another takes over when it goes."""

from __future__ import annotations

import time
from pathlib import Path

from app.adapters.db.leader import Leadership
from tests.fixtures.db import postgres_database
from tests.fixtures.waiting import until


def test_one_replica_leads_and_another_takes_over_when_it_goes() -> None:
    log: list[str] = []
    with postgres_database() as url:
        replicas = [Leadership(url, on_elected=lambda n=n: log.append(f"{n} elected"),  # type: ignore[misc]
                               on_deposed=lambda n=n: log.append(f"{n} deposed"), interval=0.1)  # type: ignore[misc]
                    for n in ("a", "b", "c")]
        try:
            for r in replicas:
                r.start()
            assert [r.leading for r in replicas] == [True, False, False]  # the first to start, at once
            time.sleep(0.5)  # the others keep trying and keep failing
            assert [r.leading for r in replicas] == [True, False, False]
            replicas[0].stop()
            assert until(lambda: sum(r.leading for r in replicas[1:]) == 1)
            time.sleep(0.5)
            assert sum(r.leading for r in replicas) == 1
        finally:
            for r in replicas:
                r.stop()
    assert log[:2] == ["a elected", "a deposed"]
    assert log[2] in ("b elected", "c elected")


def test_a_sqlite_process_leads_from_the_start(tmp_path: Path) -> None:
    elected: list[bool] = []
    leader = Leadership(f"sqlite:///{tmp_path / 'q.db'}", on_elected=lambda: elected.append(True),
                        on_deposed=lambda: None, interval=0.1)
    leader.start()
    try:
        assert leader.leading
        assert elected == [True]
    finally:
        leader.stop()
