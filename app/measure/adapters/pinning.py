"""CPU sets and thread pinning for a tunnel benchmark.

With a CPU set (e.g. ``frozenset({1})``), every thread of both charons is pinned to it for
the whole run and given back its previous affinity at the end (also on failure or Ctrl-C);
iperf3 and ping are started with that affinity (:mod:`app.measure.adapters.traffic`). On a
small shared machine the scheduler otherwise places the charons and iperf3 differently in
every run, and single-flow throughput spreads 20-90 % from run to run; on one CPU it
reflects each suite's CPU cost instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from app.measure.adapters.traffic import BenchError

__all__ = ["ThreadPins", "check_cpus", "parse_cpus", "pin_threads"]

_log = logging.getLogger(__name__)


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def check_cpus(cpus: Iterable[int]) -> frozenset[int]:
    """``cpus`` as a set, if it is non-empty and this process may run on every CPU in it.

    Raises:
        ValueError: empty, or a CPU outside ``os.sched_getaffinity(0)`` (the message names the allowed CPUs).
    """
    wanted = frozenset(cpus)
    allowed = os.sched_getaffinity(0)
    if not wanted:
        raise ValueError(f"the CPU set is empty; this process may use CPUs {_cpu_list(allowed)}")
    outside = wanted - allowed
    if outside:
        raise ValueError(f"CPU {_cpu_list(outside)} not usable; this process may use CPUs {_cpu_list(allowed)}")
    return wanted


def parse_cpus(text: str) -> frozenset[int]:
    """A comma-separated CPU list (``1``, ``0,1``), checked by :func:`check_cpus`.

    Raises:
        ValueError: not a list of CPU numbers, or a CPU this process may not use.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() for p in parts):
        raise ValueError(f"expected comma-separated CPU numbers such as 1 or 0,1, not {text!r}")
    return check_cpus(int(p) for p in parts)


class ThreadPins:
    """Pins every thread of some processes to a CPU set and gives each its previous affinity back.

    :meth:`pin` may be called again at any time: threads seen for the first time are
    pinned too. A thread is created with its creator's affinity, so one that appears in a
    process after the first :meth:`pin` is taken to have had that process's main thread's
    original affinity (what it would have had unpinned), and gets that back.

    Args:
        cpus: the CPU set (see :func:`check_cpus`).
        processes: called by every :meth:`pin`: the pids whose threads to pin.
    """

    def __init__(self, cpus: frozenset[int], processes: Callable[[], Iterable[int]]) -> None:
        self.cpus = cpus
        self._processes = processes
        self._previous: dict[tuple[int, int], set[int]] = {}  # (pid, tid) -> affinity before pinning
        self._seen: set[int] = set()
        self.pinned = 0  #: threads pinned by the last :meth:`pin`

    def pin(self) -> int:
        """Pin every thread of every process now (new ones and old ones alike).

        Returns:
            How many threads are pinned now.

        Raises:
            BenchError: the affinity of a thread cannot be set (e.g. not root).
        """
        pinned = 0
        for pid in self._processes():
            try:
                tids = sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
            except OSError:  # the process is gone
                continue
            known = pid in self._seen
            self._seen.add(pid)
            for tid in tids:
                try:
                    if (pid, tid) not in self._previous:
                        main = self._previous.get((pid, pid))
                        self._previous[pid, tid] = (set(main) if known and main is not None
                                                    else os.sched_getaffinity(tid))
                    os.sched_setaffinity(tid, self.cpus)
                except ProcessLookupError:  # the thread ended in between
                    continue
                except OSError as exc:
                    raise BenchError(f"cannot pin thread {tid} of process {pid} to CPU "
                                     f"{_cpu_list(self.cpus)}: {exc}") from exc
                pinned += 1
        self.pinned = pinned
        return pinned

    def restore(self) -> None:
        """Give every thread pinned so far its previous affinity (threads that ended are skipped)."""
        for (pid, tid), affinity in self._previous.items():
            if not Path(f"/proc/{pid}/task/{tid}").exists():  # ended: its tid may be someone else's now
                continue
            try:
                os.sched_setaffinity(tid, affinity)
            except ProcessLookupError:
                continue
            except OSError as exc:  # restore the others all the same
                _log.warning("cannot restore the CPU affinity of thread %d of process %d: %s", tid, pid, exc)
        self._previous.clear()
        self._seen.clear()


@contextlib.contextmanager
def pin_threads(cpus: frozenset[int], processes: Callable[[], Iterable[int]]) -> Iterator[ThreadPins]:
    """Every thread of ``processes()`` pinned to ``cpus`` (call ``pin()`` again to take new
    threads along); each thread's previous affinity is restored on exit, also on an exception
    or Ctrl-C.

    Raises:
        ValueError: ``cpus`` is empty or not usable here (:func:`check_cpus`).
        BenchError: a thread's affinity cannot be set.
    """
    pins = ThreadPins(check_cpus(cpus), processes)
    try:
        pins.pin()
        yield pins
    finally:
        pins.restore()

