"""The event log's ids are its commit order, on real PostgreSQL and SQLite: a follower reading
``after(last_id)`` never misses an event that committed after one it read, even when the
transaction that appended it began first."""

from __future__ import annotations

import threading

from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.unit_of_work import SqlUnitOfWork


def test_an_event_appended_first_and_committed_last_comes_after_what_a_follower_read(
        session_factory: sessionmaker[Session]) -> None:
    with SqlUnitOfWork(session_factory(), owned=True) as early, \
            SqlUnitOfWork(session_factory(), owned=True) as late, \
            SqlUnitOfWork(session_factory(), owned=True) as follower:
        early.events.append("tunnel.state", "t-early", {"state": "up"})
        early.session.flush()  # whatever else the transaction writes goes out now
        done = threading.Event()

        def commit_late() -> None:  # on SQLite it waits for early's write lock; on PostgreSQL it need not
            late.events.append("tunnel.state", "t-late", {"state": "up"})
            late.commit()
            done.set()
        writer = threading.Thread(target=commit_late)
        writer.start()
        done.wait(2)
        seen = follower.events.after(0, scopes=None)
        follower.rollback()  # a new snapshot for the next read
        early.commit()
        writer.join(30)
        assert done.is_set()
        last = seen[-1]["id"] if seen else 0
        later = follower.events.after(last, scopes=None)
        assert sorted(e["subject"] for e in seen + later) == ["t-early", "t-late"], (seen, later)


def test_an_event_of_a_rolled_back_transaction_is_never_written(session_factory: sessionmaker[Session]) -> None:
    with SqlUnitOfWork(session_factory(), owned=True) as uow:
        uow.events.append("tunnel.state", "t-gone", {"state": "up"})
        uow.rollback()
        uow.events.append("tunnel.state", "t-kept", {"state": "up"})
        uow.commit()
    with SqlUnitOfWork(session_factory(), owned=True) as reader:
        assert [e["subject"] for e in reader.events.after(0, scopes=None)] == ["t-kept"]
