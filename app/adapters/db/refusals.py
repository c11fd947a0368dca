"""Repeated refusals make one audit entry per window, not one each.

A refusal (401, 403, 413, 429, any 4xx to a request without a valid token) is recorded at
once the first time its kind is seen: its source (an address, or an IPv6 /64), outcome,
method, route and token. Those of the same kind that follow within ``window`` seconds are
only counted; when the window closes (or the process stops) they become one entry, the last
of them with its ``detail`` saying how many there were::

    299 more refusals like request 5f0c...e1 within 12 s; Unauthenticated

(:func:`more_refusals` reads the count back). Audit entries are hash-chained, so the first
entry is never updated: the summary is an entry of its own, and with it one event. At most
``max_keys`` kinds are followed at once; a new kind past that closes the oldest window early.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.domain.ports import Clock
from app.domain.ratelimit import source_key

__all__ = ["RefusalDigest", "more_refusals"]

_SUMMARY = re.compile(r"(\d+) more refusals? like request ")
_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})


def more_refusals(detail: str) -> int:
    """How many refusals a summary entry's ``detail`` stands for (0: not a summary)."""
    match = _SUMMARY.match(detail)
    return int(match.group(1)) if match else 0


@dataclass
class _Window:
    opened: float  # on the digest's clock
    first_request_id: str
    count: int = 0
    last: dict[str, Any] | None = None
    last_seen: float = 0.0


class RefusalDigest:
    """Counts repeated refusals and hands ``write`` the entries to record (see the module).

    Args:
        write: queues one audit record (never blocks).
        window: seconds a kind's refusals are counted before their summary is written.
        max_keys: kinds followed at once.
    """

    def __init__(self, write: Callable[[dict[str, Any]], None], *, window: float = 60.0,
                 max_keys: int = 10_000, clock: Clock = time.monotonic) -> None:
        self._write, self._window, self._max_keys, self._clock = write, window, max_keys, clock
        #: Kind -> its open window, oldest first (a window is opened at its kind's insertion).
        self._open: dict[tuple[str, ...], _Window] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def refused(self, fields: dict[str, Any], *, route: str) -> None:
        """One refusal: ``fields`` is its audit record (stamped with ``at``), ``route`` the
        template of the route it was for (its path if none)."""
        action = str(fields.get("action", ""))
        key = (source_key(str(fields.get("source", ""))), str(fields.get("outcome")),
               action if action in _METHODS else "other", route, str(fields.get("token_id") or ""))
        now = self._clock()
        out: list[dict[str, Any]] = []
        with self._lock:
            window = self._open.get(key)
            if window is not None and now - window.opened >= self._window:
                del self._open[key]
                out.extend(self._summary(window))
                window = None
            if window is None:
                self._open[key] = _Window(now, str(fields.get("request_id", "")))
                out.append(fields)
                while len(self._open) > self._max_keys:
                    oldest = next(iter(self._open))
                    out.extend(self._summary(self._open.pop(oldest)))
            else:
                window.count += 1
                window.last, window.last_seen = fields, now
        for record in out:
            self._write(record)

    def close_due(self) -> int:
        """Write the summaries of the windows that have closed; returns how many."""
        return self._close(everything=False)

    def close_all(self) -> int:
        """Write every open window's summary now (on shutdown); returns how many."""
        return self._close(everything=True)

    def _close(self, *, everything: bool) -> int:
        now = self._clock()
        out: list[dict[str, Any]] = []
        with self._lock:
            while self._open:
                key, window = next(iter(self._open.items()))
                if not everything and now - window.opened < self._window:
                    break  # the rest were opened later
                del self._open[key]
                out.extend(self._summary(window))
        for record in out:
            self._write(record)
        return len(out)

    @staticmethod
    def _summary(window: _Window) -> list[dict[str, Any]]:
        if window.last is None:
            return []
        record = dict(window.last)
        seconds = max(1, round(window.last_seen - window.opened))
        plural = "refusal" if window.count == 1 else "refusals"
        said = f"; {record['detail']}" if record.get("detail") else ""
        record["detail"] = (f"{window.count} more {plural} like request {window.first_request_id} "
                            f"within {seconds} s{said}")[:200]
        return [record]
