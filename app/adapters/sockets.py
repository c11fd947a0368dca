"""Socket helpers shared by the adapters that keep connections open for reuse."""

from __future__ import annotations

import select
import socket

__all__ = ["idle_and_open"]


def idle_and_open(sock: socket.socket) -> bool:
    """Whether a kept, idle connection may be used again: False if its socket has something to read
    (the peer closed it, or sent something no one asked for) or is no longer valid."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
