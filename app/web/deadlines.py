"""Deadlines inside uvicorn's HTTP protocol: for each request's head and body, for each answer's
delivery, and a size limit for every request head of a connection.

On a kept-alive connection the next request's head, and any request's body, arrive after the
connection was handed to uvicorn (by :mod:`app.web.server`, which reads a connection's first
head itself); and an answer may wait on a client that does not read it. :func:`deadline_protocol`
gives uvicorn's httptools protocol a ``header_timeout`` from the first byte after the previous
request (whatever it is: empty lines, which begin no request, count), a ``body_timeout`` from a
head's end to the end of its body (time the server itself stopped reading, its flow control,
does not count), a limit of :data:`HEAD_MAX` bytes on every request head, and a ``send_timeout``
while the transport's buffer stays over its high-water mark. Beyond a deadline the connection is
closed, with ``408`` if the request was not being answered; a head over the limit is answered
``431``; a client that takes none of its answer for ``send_timeout`` seconds is reset (its
buffer discarded, the kernel's too), which lets the request waiting to write go. When a
connection is lost, every request parsed on it and not yet answered whole is told so
(uvicorn tells only the newest: a request answered while others were pipelined behind it
would go on writing to a closed transport).

It relies on uvicorn's protocol being the callback object of its
``httptools.HttpRequestParser`` (``on_message_begin``, ``on_headers_complete`` and
``on_message_complete``, httptools' names), on its ``pause_writing``/``resume_writing``
(asyncio's flow control), on ``cycle.response_started``, ``cycle.response_complete``,
``cycle.disconnected`` and ``cycle.message_event``;
``tests/api/test_slow_clients.py`` pins that shape against the locked uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["BODY_LATE", "HEAD_LATE", "HEAD_MAX", "HEAD_TOO_LARGE", "answer", "deadline_protocol"]

#: The largest request head (request line and headers), on every request of a connection
#: (h11's default limit, which uvicorn's other protocol applies); beyond it, 431.
HEAD_MAX = 16 * 1024


def answer(status: int, reason: str, error: str, detail: str, *, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer in the service's error shape, closing the connection."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{retry}connection: close\r\n\r\n").encode() + body


HEAD_LATE = answer(408, "Request Timeout", "RequestTimeout", "the request head did not arrive in time")
BODY_LATE = answer(408, "Request Timeout", "RequestTimeout", "the request body did not arrive in time")
HEAD_TOO_LARGE = answer(431, "Request Header Fields Too Large", "RequestHeaderFieldsTooLarge",
                        f"request heads are limited to {HEAD_MAX} bytes")


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the request head is over the limit."""


def deadline_protocol(header_timeout: float, body_timeout: float, send_timeout: float = 0.0, *,
                      head_max: int = HEAD_MAX,
                      base: type[HttpToolsProtocol] = HttpToolsProtocol) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol (``base``) with a deadline for each request's head and body
    and for each answer's delivery (seconds; 0: none), and a limit on each request head's size
    (bytes; 0: none): the ``http`` class for :class:`uvicorn.Config`. All 0: ``base`` itself.

    - A head's deadline runs from the first byte after the previous request (or the connection's
      first), whatever it is: empty lines, which begin no request, count too. A body's runs from
      the end of its head. Time the server does not read the connection (its flow control, or
      the previous request still being answered) does not count. Beyond either the connection
      is closed, after a 408 if the request was not being answered.
    - Every request head of a connection, not only its first, is limited to ``head_max`` bytes:
      beyond it 431 and the connection is closed, so a head never grows past the limit and one
      read (at most 256 KiB) in memory.
    - An answer the client does not take: while the transport's buffer is over its high-water
      mark (the client reads nothing, or too little to bring it down) for ``send_timeout``
      seconds in a row, the connection is aborted, its buffer dropped, and the request that
      waits to write is told the client left.

    Only a request that does not arrive in one read arms a timer."""
    if not header_timeout and not body_timeout and not send_timeout and not head_max:
        return base
    idle, in_head, in_body = 0, 1, 2
    limits = {idle: 0.0, in_head: header_timeout, in_body: body_timeout}

    class Deadlines(base):  # type: ignore[valid-type,misc]
        #: Connections aborted because their client took no answer for ``send_timeout`` seconds.
        stalled = 0
        _qoss_phase = idle
        _qoss_since = 0.0
        _qoss_armed = idle
        _qoss_head_bytes = 0  # read since the head began (an upper bound while the head is incomplete)
        _qoss_head_size = 0  # of the head's parts parsed so far
        _qoss_too_large = False
        _qoss_timer: asyncio.TimerHandle | None = None
        _qoss_stall: asyncio.TimerHandle | None = None
        _qoss_transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            self._qoss_transport = transport
            self._qoss_cycles: list[Any] = []  # the requests parsed and not yet answered whole
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._qoss_disarm()
            self._qoss_unstall()
            # uvicorn tells only the newest request's cycle that the client left; with requests
            # pipelined behind the one being answered, the one being answered would go on writing.
            for cycle in self._qoss_cycles:
                if not cycle.response_complete:
                    cycle.disconnected = True
                    cycle.message_event.set()
            self._qoss_cycles.clear()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._qoss_phase == idle:  # whatever arrives begins the next head's time
                self._qoss_phase, self._qoss_since, self._qoss_head_bytes = in_head, time.monotonic(), 0
            if self._qoss_phase == in_head:
                self._qoss_head_bytes += len(data)
            super().data_received(data)
            transport = self._qoss_transport
            if transport is None or transport.is_closing():
                return
            if head_max and self._qoss_phase == in_head and self._qoss_head_bytes > head_max:
                self._qoss_disarm()
                self._qoss_too_large_head()
                return
            limit = limits[self._qoss_phase]
            if not limit:
                self._qoss_disarm()
            elif self._qoss_timer is None or self._qoss_armed != self._qoss_phase:
                self._qoss_disarm()
                self._qoss_arm(self._qoss_since + limit)

        # httptools' parser callbacks (uvicorn's protocol is its parser's callback object)
        def on_message_begin(self) -> None:
            if self._qoss_phase != in_head:  # begun by this read, not by bytes before it
                self._qoss_phase, self._qoss_since, self._qoss_head_bytes = in_head, time.monotonic(), 0
            self._qoss_head_size = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._qoss_grown(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._qoss_grown(len(name) + len(value) + 4)  # ": " and the line's end
            super().on_header(name, value)

        def _qoss_grown(self, size: int) -> None:
            """A head whose parts, read whole in one go, add up beyond the limit ends the parsing
            (uvicorn answers a parser error with :meth:`send_400_response`, made a 431 here)."""
            self._qoss_head_size += size
            if head_max and self._qoss_head_size > head_max:
                self._qoss_too_large = True
                raise _HeadTooLarge

        def send_400_response(self, msg: str) -> None:
            if not self._qoss_too_large:
                super().send_400_response(msg)
                return
            self._qoss_too_large_head()

        def _qoss_too_large_head(self) -> None:
            """431 (unless another answer is being written) and the connection closed."""
            transport = self._qoss_transport
            if transport is not None and not transport.is_closing():
                cycle = self.cycle
                if cycle is None or cycle.response_complete:  # not in the middle of another answer
                    transport.write(HEAD_TOO_LARGE)
                transport.close()

        def on_headers_complete(self) -> None:
            self._qoss_phase, self._qoss_since = in_body, time.monotonic()
            super().on_headers_complete()
            cycles = self._qoss_cycles = [c for c in self._qoss_cycles if not c.response_complete]
            if self.cycle is not None:
                cycles.append(self.cycle)

        def on_message_complete(self) -> None:
            self._qoss_phase = idle
            super().on_message_complete()

        # asyncio's flow control: the transport's buffer is over its high-water mark, then below
        def pause_writing(self) -> None:
            super().pause_writing()
            if send_timeout and self._qoss_stall is None:
                self._qoss_stall = asyncio.get_running_loop().call_later(send_timeout, self._qoss_stalled)

        def resume_writing(self) -> None:
            self._qoss_unstall()
            super().resume_writing()

        def _qoss_unstall(self) -> None:
            if self._qoss_stall is not None:
                self._qoss_stall.cancel()
                self._qoss_stall = None

        def _qoss_stalled(self) -> None:
            self._qoss_stall = None
            transport = self._qoss_transport
            if transport is not None and not transport.is_closing():
                Deadlines.stalled += 1
                sock = transport.get_extra_info("socket")
                if sock is not None:  # a reset, not a FIN queued behind what the client never took
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()  # connection_lost follows: a writer waiting to drain is let go

        def _qoss_arm(self, when: float) -> None:
            self._qoss_armed = self._qoss_phase
            self._qoss_timer = asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()),
                                                                     self._qoss_late)

        def _qoss_disarm(self) -> None:
            if self._qoss_timer is not None:
                self._qoss_timer.cancel()
                self._qoss_timer = None

        def _qoss_late(self) -> None:
            self._qoss_timer = None
            transport, phase = self._qoss_transport, self._qoss_phase
            if transport is None or transport.is_closing() or transport.get_protocol() is not self or phase == idle:
                return
            cycle = self.cycle
            # While the previous request is still being worked on or answered, the next head waits
            # on the server, not on the client.
            serving = phase == in_head and cycle is not None and not cycle.response_complete
            if not transport.is_reading() or serving:
                self._qoss_arm(time.monotonic() + limits[phase])  # the server's wait, not the client's
                return
            if not (phase == in_body and cycle is not None and cycle.response_started):
                transport.write(HEAD_LATE if phase == in_head else BODY_LATE)
            transport.close()  # the application, if it waits for the body, is told the client left

    Deadlines.__name__ = Deadlines.__qualname__ = f"Deadlines{base.__name__}"
    return Deadlines
