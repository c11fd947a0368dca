"""How many waiting control calls (``initiate``, ``terminate``) one charon gets from this process.

charon answers ``initiate`` and ``terminate`` in one of its worker threads, which waits
there until the SAs are up or down. The IKE messages that bring them there need worker
threads too: with every free worker waiting in a control call, nothing processes the
replies, and each call waits out its whole timeout (charon runs 16 threads by default,
about half of them taken by its receiver, sender, scheduler and the like). So this process
keeps at most ``per_socket`` such calls in one charon at a time; the others wait here, in
order, for as long as the call itself may take.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CONTROL_COMMANDS", "CONTROL_SLOTS", "ControlSlots"]

#: The commands that wait in charon for their SAs (pipelined or batched ones too).
CONTROL_COMMANDS = frozenset({"initiate", "terminate"})


class ControlSlots:
    """A bounded number of control calls per charon socket, process-wide."""

    def __init__(self, per_socket: int = 4) -> None:
        self.per_socket = per_socket
        self._lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    def configure(self, per_socket: int) -> None:
        """Set the number (for sockets not yet used: call it at start-up)."""
        if per_socket < 1:
            raise ValueError("at least one control call per charon")
        with self._lock:
            self.per_socket = per_socket
            self._slots.clear()

    def take(self, socket_path: str, timeout: float) -> Callable[[], None] | None:
        """One of ``socket_path``'s slots, within ``timeout`` seconds: the function that gives it
        back, or None if none came free in time."""
        with self._lock:
            semaphore = self._slots.get(socket_path)
            if semaphore is None:
                semaphore = self._slots[socket_path] = threading.BoundedSemaphore(self.per_socket)
        return semaphore.release if semaphore.acquire(timeout=timeout) else None


#: The slots every :class:`~app.adapters.vici.gateway.ViciGateway` of this process shares.
CONTROL_SLOTS = ControlSlots()
