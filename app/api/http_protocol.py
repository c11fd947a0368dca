"""uvicorn's httptools protocol, with each response going out in one write.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and the body when it sends ``http.response.body``: two writes,
so two segments, each crossing the whole network stack (on loopback and veth the
receiver's side too, in the sender's system call). :class:`OneWriteHttpProtocol` gives its
request cycles a transport that keeps what is written during one step of the event loop
and writes it as one segment when the step ends (or before the connection closes).
Everything else is uvicorn's own; it is passed to ``uvicorn.run(http=...)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["OneWriteHttpProtocol", "OneWriteTransport"]


class OneWriteTransport:
    """A transport whose writes in one event-loop step go out as one write (see the module).

    Closing or aborting flushes (close) or drops (abort) what is held; every other call is
    the wrapped transport's.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Write what is held now (nothing if the connection is closing: it is gone)."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(b"".join(held) if len(held) > 1 else held[0])

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._held)) + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a :class:`OneWriteTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneWriteTransport(transport, self.loop))  # type: ignore[arg-type]
