"""The audit log writer: requests append records; a background thread writes them in batches.

A negotiation must not pay a database write of its own, so records are queued and
written every ``interval`` seconds (or at once by :meth:`Auditor.flush`, which the
audit read endpoint and shutdown call, so a reader sees every record produced so far).
Records never hold key material: no request bodies, only who, what object, outcome.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.adapters.db.models import utcnow
from app.adapters.db.repositories import AuditRepository

__all__ = ["Auditor"]

log = logging.getLogger("qoss.audit")


class Auditor:
    """Batches audit records into the database."""

    def __init__(self, session_factory: Callable[[], Session], interval: float = 0.1) -> None:
        self._factory = session_factory
        self._interval = interval
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qoss-audit", daemon=True)
        self._thread.start()

    def record(self, **fields: Any) -> None:
        """Queue one record (never blocks the request); it is stamped now, not when written."""
        fields.setdefault("at", utcnow())
        self._queue.put(fields)

    def record_request(self, *, request_id: str, principal: Any, source: str, action: str, path: str,
                       outcome: int, detail: str) -> None:
        """Queue the record of one HTTP request: who (``principal``, None when anonymous), what,
        the outcome; each field cut to its column's length."""
        self.record(
            request_id=request_id,
            token_id=principal.token_id if principal else None,
            token_name=principal.name if principal else None,
            scopes=sorted(principal.scopes) if principal else [],
            source=source[:64], action=action[:16], object=path[:300], outcome=outcome, detail=detail[:200],
        )

    def flush(self) -> int:
        """Write everything queued now; returns how many records were written."""
        with self._write_lock:
            batch: list[dict[str, Any]] = []
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not batch:
                return 0
            try:
                with self._factory() as session, session.begin():
                    AuditRepository(session).append_many(batch)
            except Exception:
                # Keep the records for the next attempt (database briefly unavailable).
                for fields in batch:
                    self._queue.put(fields)
                log.exception("audit write failed; %d records kept for retry", len(batch))
                return 0
            return len(batch)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        """Stop the writer after a last flush."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
