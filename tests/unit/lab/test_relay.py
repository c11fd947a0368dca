"""The peers lab's relay on loopback (no namespace): bytes both ways, a half-close passed on,
many connections at once, a refused or reset side ending the other. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.lab.relay import relay

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
WAIT = 10.0


@contextlib.asynccontextmanager
async def relayed(upstream: Handler | None) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A relay on 127.0.0.1 to an upstream server running ``upstream`` (None: a port nobody
    listens on); yields the relay's port and what the upstream saw end (``b"eof"``, ``b"reset"``)."""
    ends: list[bytes] = []
    if upstream is None:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        server = None
    else:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await upstream(reader, writer)
                ends.append(b"eof")
            except ConnectionError:
                ends.append(b"reset")
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    listener.setblocking(False)
    task = asyncio.create_task(relay(listener, host="127.0.0.1", port=port, source="127.0.0.1"))
    try:
        yield listener.getsockname()[1], ends
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        listener.close()
        if server is not None:
            server.close()
            await server.wait_closed()


async def _count_then_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read to end of file, answer how many bytes came, then close."""
    data = await reader.read()
    writer.write(f"got {len(data)} bytes".encode())
    await writer.drain()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()


async def _wait_for_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(1024):
        pass


def test_a_half_close_is_passed_on_and_the_answer_still_comes_back() -> None:
    async def go() -> bytes:
        async with relayed(_count_then_answer) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"x" * 300_000)
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), WAIT)
            writer.close()
            return answer

    assert asyncio.run(go()) == b"got 300000 bytes"


def test_one_connection_carries_many_exchanges_and_many_connections_run_at_once() -> None:
    async def one(port: int, n: int) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        got = []
        for i in range(5):
            writer.write(f"{n}-{i}\n".encode())
            got.append(await asyncio.wait_for(reader.readline(), WAIT))
        writer.close()
        return got

    async def go() -> list[list[bytes]]:
        async with relayed(_echo) as (port, _):
            return list(await asyncio.gather(*(one(port, n) for n in range(200))))

    assert asyncio.run(go()) == [[f"{n}-{i}\n".encode() for i in range(5)] for n in range(200)]


def test_a_refused_upstream_closes_the_client_connection() -> None:
    async def go() -> bytes:
        async with relayed(None) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await asyncio.wait_for(reader.read(), WAIT)
            except ConnectionError:
                return b""
            finally:
                writer.close()

    assert asyncio.run(go()) == b""


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_client_that_goes_away_ends_its_upstream_connection(reset: bool) -> None:
    async def go() -> list[bytes]:
        async with relayed(_wait_for_eof) as (port, ends):
            client = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
            client.sendall(b"hello")
            await asyncio.sleep(0.1)
            if reset:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            for _ in range(int(WAIT / 0.02)):
                if ends:
                    break
                await asyncio.sleep(0.02)
            return ends

    assert asyncio.run(go()) == [b"eof"]
