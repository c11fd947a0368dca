"""Per-step timing of one agent message, logged at DEBUG (``qoss.agent.timing``).

Each step has its wall time and the CPU time of the thread that ran it (robust when the
machine is shared: waiting for a CPU shows in the first, not in the second). Only step
names and milliseconds are logged: never a key, a ticket or a message. Used to see where
a connect's time goes (``benchmarks/agent_join.py --breakdown`` reads it).
"""

from __future__ import annotations

import logging
import time

__all__ = ["Steps"]

log = logging.getLogger("qoss.agent.timing")


class Steps:
    """Marks the end of each step of one operation; :meth:`done` logs them at DEBUG."""

    __slots__ = ("_cpu", "_last", "_last_cpu", "_start", "_start_cpu", "_steps", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._start = self._last = time.perf_counter()
        self._start_cpu = self._last_cpu = time.thread_time()
        self._steps: list[tuple[str, float, float]] = []

    def mark(self, step: str) -> None:
        """The step named ``step`` ended now."""
        now, cpu = time.perf_counter(), time.thread_time()
        self._steps.append((step, (now - self._last) * 1000, (cpu - self._last_cpu) * 1000))
        self._last, self._last_cpu = now, cpu

    def as_dict(self, *, cpu: bool = False) -> dict[str, float]:
        """Step -> milliseconds (wall, or with ``cpu`` this thread's CPU), and ``total``."""
        out = {name: round(c if cpu else w, 3) for name, w, c in self._steps}
        total = (self._last_cpu - self._start_cpu) if cpu else (self._last - self._start)
        out["total"] = round(total * 1000, 3)
        return out

    def done(self) -> None:
        """Log the steps (DEBUG): ``<what> <step>=<wall ms>/<cpu ms> ...``."""
        if log.isEnabledFor(logging.DEBUG):
            wall, cpu = self.as_dict(), self.as_dict(cpu=True)
            log.debug("%s %s", self.what, " ".join(f"{k}={v:.2f}/{cpu[k]:.2f}" for k, v in wall.items()))
