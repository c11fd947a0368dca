"""Per-step timing of one agent message, logged at DEBUG (``qoss.agent.timing``).

Only step names and milliseconds are logged: never a key, a ticket or a message. Used to
see where a connect's time goes (``benchmarks/agent_join.py --breakdown`` reads it).
"""

from __future__ import annotations

import logging
import time

__all__ = ["Steps"]

log = logging.getLogger("qoss.agent.timing")


class Steps:
    """Marks the end of each step of one operation; :meth:`done` logs them at DEBUG."""

    __slots__ = ("_last", "_start", "_steps", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._start = self._last = time.perf_counter()
        self._steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        """The step named ``step`` ended now."""
        now = time.perf_counter()
        self._steps.append((step, (now - self._last) * 1000))
        self._last = now

    def as_dict(self) -> dict[str, float]:
        """Step -> milliseconds, and ``total``."""
        out = {name: round(ms, 3) for name, ms in self._steps}
        out["total"] = round((self._last - self._start) * 1000, 3)
        return out

    def done(self) -> None:
        """Log the steps (DEBUG)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", self.what, " ".join(f"{k}={v:.2f}" for k, v in self.as_dict().items()))
