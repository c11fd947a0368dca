"""Daemon threads of one background service, woken through one condition and stopped together."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Worker"]


class Worker:
    """The threads of a background service and the condition they wait on.

    The service's loops wait on :attr:`wake` and return once :attr:`stopping` is set;
    :meth:`stop` sets it, wakes them and joins them.

    Args:
        what: the service, as an error message names it (``the {what} was started already``).
    """

    def __init__(self, what: str) -> None:
        self.wake = threading.Condition()
        self.stopping = False
        self._what = what
        self._threads: list[threading.Thread] = []

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (the service runs in the background)."""
        return bool(self._threads)

    def start(self, *loops: tuple[str, Callable[[], None]]) -> None:
        """Start one daemon thread per ``(thread name, loop)``, in order.

        Raises:
            RuntimeError: started already.
        """
        if self._threads:
            raise RuntimeError(f"the {self._what} was started already")
        for name, loop in loops:
            thread = threading.Thread(target=loop, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float) -> None:
        """Set :attr:`stopping`, wake every waiter and wait up to ``timeout`` seconds for each thread."""
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)
