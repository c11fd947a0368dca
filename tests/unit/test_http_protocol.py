"""One write per response: the transport that holds a loop step's writes, and real uvicorn with it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from app.api.http_protocol import OneWriteHttpProtocol, OneWriteTransport


class Recorder:
    """A transport that records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing or self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default


def test_writes_in_one_loop_step_go_out_as_one() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes], int]:
        inner = Recorder()
        t = OneWriteTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"")
        t.write(memoryview(b"body"))
        held = t.get_write_buffer_size()
        before = list(inner.writes)
        await asyncio.sleep(0)  # the step ends
        return before, inner.writes, held

    before, after, held = asyncio.run(scenario())
    assert before == []
    assert after == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert held == len(b"HTTP/1.1 200 OK\r\n\r\nbody")


def test_close_flushes_abort_drops_and_a_closing_transport_gets_nothing() -> None:
    async def scenario() -> tuple[Recorder, Recorder, Recorder]:
        loop = asyncio.get_running_loop()
        closed, aborted, gone = Recorder(), Recorder(), Recorder()
        t = OneWriteTransport(closed, loop)  # type: ignore[arg-type]
        t.write(b"last words")
        t.close()
        t = OneWriteTransport(aborted, loop)  # type: ignore[arg-type]
        t.write(b"never sent")
        t.abort()
        t = OneWriteTransport(gone, loop)  # type: ignore[arg-type]
        t.write(b"too late")
        gone.closing = True  # the peer went away before the step ended
        await asyncio.sleep(0)
        return closed, aborted, gone

    closed, aborted, gone = asyncio.run(scenario())
    assert closed.writes == [b"last words"]
    assert closed.closed
    assert aborted.writes == []
    assert aborted.aborted
    assert gone.writes == []
    loop = asyncio.new_event_loop()
    try:
        t = OneWriteTransport(Recorder(), loop)  # type: ignore[arg-type]
        assert t.get_extra_info("peername") == ("127.0.0.1", 1234)  # everything else is the transport's
    finally:
        loop.close()


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Plain, streamed (chunked) and closing responses."""
    assert scope["type"] == "http"
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(_app, log_level="warning", http=OneWriteHttpProtocol, lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started
    yield port
    srv.should_exit = True
    thread.join(10)
    sock.close()


def _read_until(conn: socket.socket, end: bytes) -> bytes:
    data = b""
    conn.settimeout(5)
    while not data.endswith(end):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_real_uvicorn_answers_keep_alive_streamed_and_closing_requests(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as conn:
        for path in (b"/first", b"/second"):  # one kept connection
            conn.sendall(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = _read_until(conn, path)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.endswith(b"\r\n\r\n" + path)
        conn.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        streamed = _read_until(conn, b"0\r\n\r\n")
        assert b"transfer-encoding: chunked" in streamed
        assert streamed.endswith(b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server)) as conn:
        conn.sendall(b"GET /bye HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = _read_until(conn, b"\x00never")  # reads until the server closes
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer.endswith(b"/bye")
