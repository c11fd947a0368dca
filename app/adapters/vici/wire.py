"""charon's answers read straight off its socket: packets in large reads, each message decoded
in one pass.

Every SA that comes up or goes down makes charon send each listener an event whose message
holds the whole IKE_SA with its CHILD_SAs (about a kilobyte), and every ``initiate`` streams a
dozen log lines. The ``vici`` package reads a packet in two ``recv`` calls with three socket
time-out changes around them and decodes its message into ``bytes`` values
(``Message.deserialize``), which :func:`app.adapters.vici.models.decode` turns into ``str``
afterwards: about 130 us for an event here. :func:`read_message` does the decoding and the
``str`` conversion together (about a sixth of that), and :class:`PacketReader` frames packets
out of reads of up to 64 KiB. The event listener (:mod:`app.adapters.vici.events`) and the
pipeline's replies (:mod:`app.adapters.vici.pipeline`) read this way.

This is VICI's own wire format (strongSwan's description of the protocol), not the ``vici``
package's internals: only the socket of the session is taken. ``tests/unit/adapters/vici/
test_event_wire.py`` checks :func:`read_message` against the package's decoder on the same
bytes, and the listener and control calls against the fake charon both ways. With
``QOSS_FAST_PATHS=false`` the package's ``Session.listen`` and ``streamed_request`` are used.
"""

from __future__ import annotations

import socket
from typing import Any

from vici.exception import DeserializationException

__all__ = ["CMD_REQUEST", "CMD_RESPONSE", "EVENT", "EVENT_CONFIRM", "EVENT_REGISTER", "EVENT_UNKNOWN",
           "EVENT_UNREGISTER", "PacketReader", "packet", "read_message"]

# Packet types (the first byte of a packet).
CMD_REQUEST = 0
CMD_RESPONSE = 1
EVENT_REGISTER = 3
EVENT_UNREGISTER = 4
EVENT_CONFIRM = 5
EVENT_UNKNOWN = 6
EVENT = 7
_NAMED = frozenset({CMD_REQUEST, EVENT_REGISTER, EVENT_UNREGISTER, EVENT})

# Message elements.
_SECTION_START, _SECTION_END, _KEY_VALUE, _LIST_START, _LIST_ITEM, _LIST_END = 1, 2, 3, 4, 5, 6

#: The largest packet charon sends (its own limit on a message), checked before buffering one.
MAX_PACKET = 512 * 1024


def read_message(data: bytes) -> dict[str, Any]:
    """A VICI message as nested ``dict``s and ``list``s of ``str`` (UTF-8, undecodable bytes
    replaced): what ``decode(Message.deserialize(...))`` gives, in one pass.

    Raises:
        vici.exception.DeserializationException: not a well-formed message (truncated, an
            unknown element, an unbalanced section or list).
    """
    root: dict[str, Any] = {}
    section = root
    stack: list[dict[str, Any]] = []
    items: list[str] | None = None
    i, end = 0, len(data)
    try:
        while i < end:
            kind = data[i]
            if kind == _KEY_VALUE and items is None:
                j = i + 2 + data[i + 1]
                k = j + 2 + (data[j] << 8 | data[j + 1])
                if k > end:
                    raise IndexError
                section[data[i + 2:j].decode("utf-8", "replace")] = data[j + 2:k].decode("utf-8", "replace")
                i = k
            elif kind == _LIST_ITEM and items is not None:
                k = i + 3 + (data[i + 1] << 8 | data[i + 2])
                if k > end:
                    raise IndexError
                items.append(data[i + 3:k].decode("utf-8", "replace"))
                i = k
            elif kind == _SECTION_START and items is None:
                j = i + 2 + data[i + 1]
                if j > end:
                    raise IndexError
                inner: dict[str, Any] = {}
                section[data[i + 2:j].decode("utf-8", "replace")] = inner
                stack.append(section)
                section, i = inner, j
            elif kind == _SECTION_END and items is None and stack:
                section, i = stack.pop(), i + 1
            elif kind == _LIST_START and items is None:
                j = i + 2 + data[i + 1]
                if j > end:
                    raise IndexError
                items = section[data[i + 2:j].decode("utf-8", "replace")] = []
                i = j
            elif kind == _LIST_END and items is not None:
                items, i = None, i + 1
            else:
                raise DeserializationException(f"unexpected element {kind} at {i}")
    except IndexError:
        raise DeserializationException(f"truncated message at {i}") from None
    if stack or items is not None:
        raise DeserializationException("message ends inside a section or list")
    return root


def packet(kind: int, name: str | None = None, payload: bytes = b"") -> bytes:
    """One framed packet (length, type, the name of a named type, the message)."""
    body = bytes([kind]) + (bytes([len(name)]) + name.encode() if name is not None else b"") + payload
    return len(body).to_bytes(4, "big") + body


class PacketReader:
    """Packets off one stream socket, read up to 64 KiB at a time."""

    __slots__ = ("_buffer", "_socket")

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes read and not yet handed out."""
        return len(self._buffer)

    def _framed(self) -> tuple[int, str | None, bytes] | None:
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        length = int.from_bytes(buffer[:4], "big")
        if not 1 <= length <= MAX_PACKET:
            raise DeserializationException(f"a packet of {length} bytes")
        if len(buffer) < 4 + length:
            return None
        body = bytes(buffer[4:4 + length])
        del buffer[:4 + length]
        kind, name, start = body[0], None, 1
        if kind in _NAMED:
            start = 2 + body[1]
            name = body[2:start].decode("utf-8", "replace")
        return kind, name, body[start:]

    def next(self) -> tuple[int, str | None, bytes] | None:
        """The next packet: (type, name or None, message bytes); None if the socket's time-out
        passed first (a packet begun stays buffered for the next call).

        Raises:
            ConnectionError: charon closed the connection.
            OSError: the socket failed.
        """
        while True:
            found = self._framed()
            if found is not None:
                return found
            try:
                chunk = self._socket.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise ConnectionError("charon closed the connection")
            self._buffer += chunk
