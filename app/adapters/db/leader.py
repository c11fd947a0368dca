"""One leader among the replicas that share a database, for the work only one of them may do
(the tunnel monitor, reconcile, moving tunnels after an edit).

On PostgreSQL the leader is the replica holding a session-level advisory lock on a connection
of its own: if the replica dies, or its connection does, the server releases the lock and the
next replica to try takes it over (each tries every ``interval`` seconds). On SQLite there is
one process per database file, and it leads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from sqlalchemy import Connection, Engine, create_engine, pool, text

__all__ = ["LOCK_KEY", "Leadership"]

log = logging.getLogger("qoss.leader")

#: The advisory lock's key: "qoss" in ASCII, one number every replica agrees on.
LOCK_KEY = 0x716F7373


class Leadership:
    """Whether this process leads, kept up to date in a thread of its own.

    Args:
        database_url: the shared database.
        on_elected: called (in the leadership thread) when this process becomes the leader.
        on_deposed: called when it stops being the leader (its connection was lost).
        interval: seconds between tries to become leader, and between checks that it still is.
    """

    def __init__(self, database_url: str, *, on_elected: Callable[[], None], on_deposed: Callable[[], None],
                 interval: float = 2.0) -> None:
        self._postgres = database_url.startswith("postgresql")
        self._engine: Engine | None = (create_engine(database_url, poolclass=pool.NullPool)
                                       if self._postgres else None)
        self._on_elected, self._on_deposed, self._interval = on_elected, on_deposed, interval
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leading = False

    def start(self) -> None:
        """Try once now (the first replica to start leads before it serves), then keep trying."""
        self._step()
        self._thread = threading.Thread(target=self._run, name="qoss-leader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._step_down()
        if self._engine is not None:
            self._engine.dispose()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._step()

    def _step(self) -> None:
        try:
            if not self.leading and self._try():
                self._take_office()
            elif self.leading and not self._still():
                log.warning("leadership lost (the database connection that held it is gone)")
                self._step_down()
        except Exception:  # the loop must outlive any one failure
            log.exception("leadership: a try failed")
            self._step_down()

    def _try(self) -> bool:
        """Whether this process holds the lock now (taking it if it is free)."""
        if not self._postgres:
            return True
        assert self._engine is not None
        if self._conn is None:
            self._conn = self._engine.connect()
        taken = bool(self._conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": LOCK_KEY}).scalar())
        self._conn.commit()
        if not taken:
            self._drop_connection()
        return taken

    def _still(self) -> bool:
        """Whether the connection holding the lock still answers."""
        if not self._postgres:
            return True
        try:
            assert self._conn is not None
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
            return True
        except Exception:
            return False

    def _take_office(self) -> None:
        self.leading = True
        log.info("this process leads: it runs the tunnel monitor, reconcile and tunnel moves")
        self._on_elected()

    def _step_down(self) -> None:
        was = self.leading
        self.leading = False
        self._drop_connection()  # the server releases the lock with the connection
        if was:
            with contextlib.suppress(Exception):
                self._on_deposed()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
