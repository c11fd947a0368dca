"""UNIX sockets that are not a charon's: each kind of "nothing sensible answers" a gateway's
registration can meet, on a real socket at a path of the test's choosing."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = ["Behaviour", "NotACharon", "refused_socket"]

#: What the socket does with a client:
#: ``silent`` accepts and never answers; ``reset`` accepts and closes at once; ``garbage``
#: answers every request with bytes that are no VICI message; ``frame`` answers with a well-formed
#: VICI reply that says nothing (no daemon, no version); ``half`` sends the first byte of a reply
#: and then nothing; ``huge`` announces a reply of 4 GiB and streams zeros.
Behaviour = Literal["silent", "reset", "garbage", "frame", "half", "huge"]

_EMPTY_REPLY = struct.pack("!IB", 1, 1)  # a CMD_RESPONSE with an empty message


class NotACharon:
    """A listening UNIX socket at ``path`` that behaves as ``behaviour`` says, served by one
    thread until the context ends (every connection is closed then, and any held ``hold``
    seconds before: a client that would wait for ever is let go)."""

    def __init__(self, path: str | Path, behaviour: Behaviour, hold: float = 20.0) -> None:
        self.path = str(path)
        self.behaviour = behaviour
        self.hold = hold
        self.accepted = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._clients: list[socket.socket] = []
        self._since: dict[socket.socket, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"not-a-charon-{behaviour}", daemon=True)

    def __enter__(self) -> NotACharon:
        self._server.bind(self.path)
        self._server.listen(64)
        self._server.settimeout(0.05)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(10)
        self._server.close()
        for client in self._clients:
            client.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def wait_for(self, connections: int, seconds: float) -> bool:
        """Whether ``connections`` clients have been accepted within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.accepted < connections and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.accepted >= connections

    def _serve(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                client, _ = self._server.accept()
                self.accepted += 1
                if self.behaviour == "reset":
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()
                    continue
                client.setblocking(False)
                self._clients.append(client)
                self._since[client] = time.monotonic()
            self._answer()
            for client in [c for c in self._clients if time.monotonic() - self._since[c] > self.hold]:
                self._clients.remove(client)
                client.close()

    def _answer(self) -> None:
        """Read what each client sent; answer as the behaviour says."""
        if not self._clients:
            return
        readable, _, _ = select.select(self._clients, [], [], 0)
        for client in readable:
            try:
                data = client.recv(65536)
            except OSError:
                continue
            if not data:
                continue
            with contextlib.suppress(OSError):
                if self.behaviour == "garbage":
                    client.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n\xff\xfe garbage")
                elif self.behaviour == "frame":
                    client.sendall(_EMPTY_REPLY)
                elif self.behaviour == "half":
                    client.sendall(b"\x00")
                elif self.behaviour == "huge":
                    client.sendall(struct.pack("!I", 0xFFFFFFFF) + bytes(60_000))


def refused_socket(path: str | Path) -> None:
    """A socket file nobody listens on (its owner bound it and went away): connect is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    finally:
        sock.close()
