"""A TCP relay from a listening socket in one network namespace to an address in another.

The peers lab (:mod:`app.lab.peers`) makes each site's API reachable from the root namespace
without a route or an interface there: it binds a listening socket on ``127.0.0.1`` in the
root namespace and starts this module inside the site's namespace with that socket as an
inherited file descriptor (``ip netns exec NS python -m app.lab.relay --fd N --to ADDR:PORT``).
A socket keeps the namespace it was made in, so connections arrive on the root namespace's
loopback while every upstream connection is made inside the site's namespace.

Each connection is relayed byte for byte in both directions, so HTTP/1.1 keep-alive,
pipelining and streamed answers pass as they are, and connections are independent of each
other (one asyncio task pair each). A half-close is passed on; an error on either side
closes both. Upstream connections come from ``--source`` (default ``127.0.0.1``: the relay
is a proxy on the same host, so the service does not count its connections against one
client address). Standard library only: it starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import Sequence

__all__ = ["main", "relay"]

_CHUNK = 64 * 1024
_CONNECT_TIMEOUT = 10.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of file, then pass the half-close on."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, asyncio.CancelledError):
        await writer.wait_closed()


async def _serve_one(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, *,
                     host: str, port: int, source: str | None) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(source, 0) if source else None), _CONNECT_TIMEOUT)
    except (OSError, TimeoutError):
        await _close(client_writer)
        return
    tasks = [asyncio.create_task(_pipe(client_reader, upstream_writer)),
             asyncio.create_task(_pipe(upstream_reader, client_writer))]
    try:
        pending: set[asyncio.Task[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() is not None for t in done):  # a reset or a broken pipe: end both ways
                break
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        await _close(upstream_writer)
        await _close(client_writer)


async def relay(listener: socket.socket, *, host: str, port: int, source: str | None = "127.0.0.1") -> None:
    """Accept on ``listener`` and relay every connection to ``host``:``port`` until cancelled.

    Args:
        listener: a bound, listening TCP socket (of any namespace).
        host: the upstream address (connections to it are made in this process's namespace).
        port: the upstream port.
        source: the address upstream connections come from (None: the kernel's choice).
    """
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_one(reader, writer, host=host, port=port, source=source)

    server = await asyncio.start_server(handle, sock=listener, limit=_CHUNK)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m app.lab.relay --fd N --to ADDRESS:PORT [--source ADDRESS]``."""
    parser = argparse.ArgumentParser(prog="python -m app.lab.relay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="an inherited listening TCP socket")
    parser.add_argument("--to", required=True, help="ADDRESS:PORT to relay to ([ADDRESS]:PORT for IPv6)")
    parser.add_argument("--source", default="127.0.0.1", help="the upstream connections' address ('': any)")
    args = parser.parse_args(argv)
    address, _, port = str(args.to).rpartition(":")
    listener = socket.socket(fileno=args.fd)
    listener.setblocking(False)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(relay(listener, host=address.strip("[]"), port=int(port), source=args.source or None))


if __name__ == "__main__":
    main()
