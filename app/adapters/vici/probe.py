"""Reading a socket that may not be a charon's: what a gateway's registration asks of it.

A registration names a socket it has never been shown to be charon's, so its reading is held
to one deadline for everything (connecting and every reply, however the bytes trickle in) and
to VICI's own limit on a message's size. ``vici``'s transport lifts the socket's timeout once a
reply's first byte has come (so that a slow reply is not cut in two), and it reads whatever
length a reply announces: a socket that sends one byte, or announces 4 GiB, would hold a thread
for ever or fill its memory. Here, either ends in :class:`~app.domain.errors.GatewayUnreachable`
at the deadline, as a socket error or a protocol error does.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import vici
import vici.exception
import vici.protocol

from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.session import Connect, ViciSession, unix_connect

__all__ = ["prober"]


class _DeadlineTransport(vici.protocol.Transport):  # type: ignore[misc]  # vici ships no types
    """vici's framing with one deadline for every read and VICI's limit on a message's size."""

    def __init__(self, sock: object, deadline: float) -> None:
        super().__init__(sock)
        self._deadline = deadline

    def receive(self, timeout: object = None) -> bytes:
        (length,) = struct.unpack("!I", self._read(self.HEADER_LENGTH))
        if length > self.MAX_SEGMENT:
            raise vici.exception.DeserializationException(
                f"a message of {length} bytes announced (VICI's limit is {self.MAX_SEGMENT})")
        return self._read(length)

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no whole answer before the deadline")
            self.socket.settimeout(left)
            chunk = self.socket.recv(count - len(data))
            if not chunk:
                raise ConnectionResetError("the other end closed the connection")
            data += chunk
        return bytes(data)


def _connect_by(deadline: float) -> Connect:
    """A :data:`Connect` whose sessions give up at ``deadline`` (``time.monotonic``)."""

    @contextmanager
    def connect(socket_path: str, timeout: float) -> Iterator[ViciSession]:
        left = min(timeout, deadline - time.monotonic())
        if left <= 0:
            raise TimeoutError("no time left to connect")
        with unix_connect(socket_path, left) as session:
            if isinstance(session, vici.Session):
                session.transport = _DeadlineTransport(session.transport.socket, deadline)
            yield session

    return connect


def prober(timeout: float) -> Callable[[str], ViciGateway]:
    """Socket path -> a gateway for one probe: everything asked of it (a new connection per
    command, none kept for reuse) must be answered within ``timeout`` seconds of this call.
    Nothing is counted in the metrics: their series are per socket, and a probe's socket is
    whatever path a client sent.

    Failures are those of :class:`ViciGateway`: ``GatewayUnreachable`` (missing, refused, reset,
    silent, too slow, not VICI), ``GatewayRejected`` (charon refused the command).
    """
    connect = _connect_by(time.monotonic() + timeout)
    return lambda path: ViciGateway(path, timeout, connect=connect, pool=None)
