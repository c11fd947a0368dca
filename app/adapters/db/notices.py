"""Replicas tell each other what they changed: PostgreSQL's NOTIFY, so each process's read
caches (API tokens, registered gateways, rating tables) forget a changed row at once instead of
trusting none.

A change to a cached row sends ``NOTIFY qoss_cache, '<kind>:<key>'`` in its own transaction
(:func:`publish`): PostgreSQL delivers it when that transaction commits, never for one rolled
back. Every process follows the channel on a connection of its own (:class:`NoticeListener`);
a notice makes the matching cache forget the key. While the listener is connected, the caches
trust a read for their replica TTL; as soon as it is not (the database went away, the
connection broke), they are emptied and trust nothing (TTL 0) until it is back, so a notice
missed in between can never leave a stale row trusted. On SQLite (one process per database
file) nothing is sent or followed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

__all__ = ["CHANNEL", "Forgetting", "NoticeListener", "publish"]

log = logging.getLogger("qoss.notices")

#: The channel every replica of one database follows.
CHANNEL = "qoss_cache"
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :payload)")


def publish(session: Session, kind: str, key: str) -> None:
    """Tell the other replicas, when ``session``'s transaction commits, that ``kind`` ``key`` changed."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        session.execute(_NOTIFY, {"payload": f"{kind}:{key}"[:7999]})


class Forgetting(Protocol):
    """A cache a notice can empty: one key, all of it, and its TTL switched."""

    ttl: float

    def forget(self, key: str) -> None: ...

    def clear(self) -> None: ...


class NoticeListener:
    """Follows :data:`CHANNEL` on a connection of its own, in a thread; while connected, each cache
    in ``caches`` (by kind) trusts a read for its TTL from ``ttls``, otherwise for none."""

    def __init__(self, database_url: str, caches: Mapping[str, Forgetting], ttls: Mapping[str, float], *,
                 retry: float = 1.0, connect: Callable[[str], Any] | None = None) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._caches, self._ttls, self._retry = dict(caches), dict(ttls), retry
        self._connect = connect or _psycopg_connect
        self._stop = threading.Event()
        self.connected = threading.Event()
        self.received = 0
        self._thread = threading.Thread(target=self._run, name="qoss-notices", daemon=True)
        self._trust(False)

    def start(self) -> NoticeListener:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _trust(self, connected: bool) -> None:
        """Empty every cache; then, connected, trust reads for the replica TTLs, else for none."""
        for kind, cache in self._caches.items():
            cache.ttl = self._ttls[kind] if connected else 0.0
            cache.clear()
        (self.connected.set if connected else self.connected.clear)()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._connect(self._dsn) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._trust(True)
                    log.info("following the other replicas' changes (LISTEN %s)", CHANNEL)
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=0.5):
                            self._apply(notice.payload)
            except Exception as exc:  # the database went away: trust nothing until it is back
                if self.connected.is_set():
                    log.warning("lost the other replicas' changes (%s): caches off until reconnected",
                                type(exc).__name__)
                self._trust(False)
                self._stop.wait(self._retry)
        self._trust(False)

    def _apply(self, payload: str) -> None:
        self.received += 1
        kind, _, key = payload.partition(":")
        cache = self._caches.get(kind)
        if cache is not None:
            cache.forget(key)


def _psycopg_connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)
