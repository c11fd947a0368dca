"""Hostile clients at one `qoss serve` process: how many ordinary requests it answers, and how
fast, while hundreds of connections of one hostile kind work on it, against the same load with
no hostile client, in one run.

    .venv/bin/python -m benchmarks.slow_clients                        # every kind, 200 sockets each
    .venv/bin/python -m benchmarks.slow_clients --sockets 20 --seconds 3   # a smoke run
    .venv/bin/python -m benchmarks.slow_clients --kinds drip,never-read    # some kinds
    .venv/bin/python -m benchmarks.slow_clients --root /tmp/other-checkout # another checkout's code
    .venv/bin/python -m benchmarks.slow_clients --front qoss,haproxy       # then behind HAProxy

The kinds (each socket from 127.0.0.2 and up, loopback only; one the server closes is opened
again at once, as an attacker would):

- ``drip``: a request line, then one header line every --every seconds, never the end of the head;
- ``blank``: only empty lines, one every --every seconds (they begin no request);
- ``blank-after``: a request answered, then empty lines on the kept-alive connection;
- ``big-later-head``: a request answered, then a head that never ends, 64 KiB at a time (64 MiB at most);
- ``unfinished-body``: a head announcing 1,000 bytes of body, and 10 of them;
- ``never-read``: a receive window of 4 KiB, three requests for the 1.7 MB Swagger bundle pipelined,
  and nothing read;
- ``never-read-api``: the same with forty requests for the 100 KB OpenAPI document;
- ``half-closed``: half a request head, then the sending side shut;
- ``pipelined-probe``: ``GET /healthz`` with an ordinary request pipelined behind it, both read.

Once a kind's N sockets are open, --clients ordinary clients each send
`GET /v1/rating-tables/standards-2026/revisions` on a new connection, one after another, for
--seconds, each with a 10 s timeout. Printed per kind: the ordinary requests answered 200, those
not answered (a status, a time-out), their p50 and p99, their count and p99 as a multiple of the
run with no hostile client, how many hostile connections were opened and how many the server
closed, and the server's RSS at the end of the kind against its start. The server runs with the
service's defaults on SQLite; the process's open-file limit is raised to its hard limit first
(the server inherits it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PATH = "/v1/rating-tables/standards-2026/revisions"
#: Slow sockets opened at once (the rest wait their turn to connect).
_OPENING = 200


@dataclass
class Phase:
    """One hostile kind: what the ordinary clients saw, and what the hostile sockets did."""

    kind: str
    sockets: int
    latencies: list[float] = field(default_factory=list)  # seconds, of the requests answered 200
    other: dict[str, int] = field(default_factory=dict)  # what the rest got: a status or an error's name
    opened: int = 0
    closed_by_server: int = 0
    rss: int = 0  # the server's, at the end of the kind

    @property
    def answered(self) -> int:
        return len(self.latencies)

    @property
    def unanswered(self) -> int:
        return sum(self.other.values())


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by the nearest rank; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def source_address(i: int) -> str:
    """The loopback address the ``i``-th hostile socket connects from: 127.0.0.2 and up, 250 to each."""
    n = 2 + i // 250
    return f"127.0.{n // 250}.{n % 250 + (1 if n // 250 else 0)}"


def _raise_open_files(needed: int) -> int:
    """Raise the soft open-file limit to the hard one if ``needed`` descriptors do not fit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


_BUNDLE = b"GET /docs/static/swagger-ui-bundle.js HTTP/1.1\r\nHost: qoss\r\n\r\n"
_SCHEMA = b"GET /openapi.json HTTP/1.1\r\nHost: qoss\r\n\r\n"
_LIVEZ = b"GET /livez HTTP/1.1\r\nHost: qoss\r\n\r\n"
_ESTABLISHED = 1  # linux/tcp_states.h: struct tcp_info begins with the socket's state


async def _until_closed(reader: asyncio.StreamReader, stop: asyncio.Event, every: float = 1.0,
                        then: bytes = b"", writer: asyncio.StreamWriter | None = None) -> None:
    """Read (and drop) whatever comes until the server closes; with ``then``, send it every ``every`` s."""
    while not stop.is_set():
        try:
            got = await asyncio.wait_for(reader.read(65536), every)
        except TimeoutError:
            if then and writer is not None:
                writer.write(then)
            continue
        if not got:
            return


async def _one_answer(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)


async def _act(kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, every: float,
               stop: asyncio.Event) -> None:
    """What one hostile socket of ``kind`` does, until the server closes it (or ``stop``)."""
    if kind == "drip":
        writer.write(f"GET {PATH} HTTP/1.1\r\nHost: qoss\r\n".encode())
        line = 0
        while not stop.is_set():
            try:
                got = await asyncio.wait_for(reader.read(4096), every)
            except TimeoutError:
                writer.write(f"X-Slow-{line}: {line}\r\n".encode())
                line += 1
                continue
            if not got or got.startswith(b"HTTP/"):
                return
    elif kind in ("blank", "blank-after"):
        if kind == "blank-after":
            writer.write(_LIVEZ)
            await _one_answer(reader)
        writer.write(b"\r\n")
        await _until_closed(reader, stop, every, b"\r\n", writer)
    elif kind == "big-later-head":
        writer.write(_LIVEZ)
        await _one_answer(reader)
        writer.write(b"GET /livez HTTP/1.1\r\nHost: qoss\r\nX-Big: ")
        chunk = b"a" * 65536
        for _ in range(1024):
            if stop.is_set() or reader.at_eof():
                return
            writer.write(chunk)
            await writer.drain()
        await _until_closed(reader, stop)
    elif kind == "unfinished-body":
        writer.write(b"POST /v1/negotiations HTTP/1.1\r\nHost: qoss\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"peers\": ")
        await _until_closed(reader, stop)
    elif kind in ("never-read", "never-read-api"):
        writer.write(_BUNDLE * 3 if kind == "never-read" else _SCHEMA * 40)
        sock = writer.get_extra_info("socket")
        while not stop.is_set():  # read nothing: watch the socket's state for the server's FIN or RST
            if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _ESTABLISHED:
                return
            await asyncio.sleep(0.2)
    elif kind == "half-closed":
        writer.write(b"GET /v1/algor")
        writer.write_eof()
        await _until_closed(reader, stop)
    elif kind == "pipelined-probe":
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: qoss\r\n\r\n" + _LIVEZ)
        await _until_closed(reader, stop)
    else:
        raise ValueError(kind)


KINDS = ("drip", "blank", "blank-after", "big-later-head", "unfinished-body", "never-read", "never-read-api",
         "half-closed", "pipelined-probe")


async def _hostile(kind: str, host: str, port: int, i: int, every: float, stop: asyncio.Event, phase: Phase,
                   opening: asyncio.Semaphore) -> None:
    """One hostile client of ``kind``, opening its connection again whenever the server closes it."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        async with opening:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if kind.startswith("never-read"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.bind((source_address(i), 0))
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
                reader, writer = await asyncio.open_connection(sock=sock)
            except (OSError, TimeoutError):
                sock.close()
                await asyncio.sleep(0.5)
                continue
        phase.opened += 1
        try:
            await _act(kind, reader, writer, every, stop)
            if not stop.is_set():
                phase.closed_by_server += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            phase.closed_by_server += 1
        finally:
            writer.transport.abort()


async def _ordinary(base: str, seconds: float, phase: Phase) -> None:
    """Requests on a new connection each, one after another, for ``seconds``."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                r = await client.get(PATH)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            else:
                if r.status_code == 200:
                    phase.latencies.append(time.perf_counter() - started)
                    continue
                key = str(r.status_code)
            phase.other[key] = phase.other.get(key, 0) + 1


async def _phase(base: str, kind: str, n: int, *, seconds: float, every: float, clients: int) -> Phase:
    host, port = base.removeprefix("http://").split(":")
    phase = Phase(kind=kind, sockets=n)
    stop = asyncio.Event()
    opening = asyncio.Semaphore(_OPENING)
    hostile = [asyncio.create_task(_hostile(kind, host, int(port), i, every, stop, phase, opening))
               for i in range(n)]
    try:
        for _ in range(600):  # all N open, 60 s at most
            if phase.opened >= n:
                break
            await asyncio.sleep(0.1)
        await asyncio.gather(*(_ordinary(base, seconds, phase) for _ in range(clients)))
    finally:
        stop.set()
        await asyncio.gather(*hostile, return_exceptions=True)
    return phase


def _serve(root: Path, work: Path) -> tuple[str, subprocess.Popen[bytes]]:
    env = {**os.environ, "QOSS_DATABASE_URL": f"sqlite:///{work / 'q.db'}", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning", "QOSS_STATE_DIR": str(work / "var")}
    qoss = [sys.executable, "-m", "app.cli"]  # that checkout's code
    if root.resolve() != ROOT:  # this checkout's `qoss serve` migrates its database itself as it starts
        subprocess.run([*qoss, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=root, timeout=120)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with (work / "serve.log").open("wb") as log:
        proc = subprocess.Popen([*qoss, "serve", "--port", str(port)], env=env, stdout=log, stderr=log, cwd=root)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/livez", timeout=1).status_code == 200:
                return base, proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"qoss serve did not start: {(work / 'serve.log').read_text()[-2000:]}")


#: HAProxy in front of qoss with deadlines of its own like qoss's: a whole head within 10 s (16 KiB
#: buffers: a longer head is refused), a client idle (sending or taking nothing) for 10 s dropped,
#: a body buffered before it is passed on, kept-alive connections closed after 5 s.
_HAPROXY = """global
  maxconn 8192
defaults
  mode http
  option http-buffer-request
  timeout connect 5s
  timeout client 10s
  timeout http-request 10s
  timeout http-keep-alive 5s
  timeout server 60s
frontend qoss
  bind 127.0.0.1:{port}
  default_backend api
backend api
  server qoss 127.0.0.1:{upstream} maxconn 256
"""


def _haproxy(work: Path, upstream: str) -> tuple[str, subprocess.Popen[bytes]]:
    """HAProxy (Debian's) on a free loopback port in front of ``upstream``; its base URL and process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = work / "haproxy.cfg"
    config.write_text(_HAPROXY.format(port=port, upstream=upstream.rsplit(":", 1)[1]))
    with (work / "haproxy.log").open("wb") as log:
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/livez", timeout=1).status_code == 200:
                return base, proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"haproxy did not start: {(work / 'haproxy.log').read_text()[-2000:]}")


def run(kinds: list[str], *, sockets: int, seconds: float, every: float, clients: int, root: Path,
        front: str = "qoss") -> list[Phase]:
    """No hostile client, then each kind in turn, at one fresh server (``front`` "haproxy": behind
    HAProxy, the clients at HAProxy); its phases."""
    limit = _raise_open_files(2 * sockets + 1024)
    work = Path(tempfile.mkdtemp(prefix="qoss-slow-clients-"))
    base, proc = _serve(root, work)
    start = _rss(proc.pid)
    fronted: subprocess.Popen[bytes] | None = None
    if front == "haproxy":
        base, fronted = _haproxy(work, base)
    print(f"qoss serve ({root}) on SQLite with its defaults, RSS {start / 2**20:.0f} MB"
          f"{', behind HAProxy' if fronted else ''}; open-file limit {limit}; "
          f"{sockets} hostile sockets of each kind; {clients} ordinary client(s), {seconds:g} s per kind", flush=True)
    phases = []
    try:
        for k, kind in enumerate(["none", *kinds]):
            n = 0 if kind == "none" else sockets
            phase = asyncio.run(_phase(base, kind, n, seconds=seconds, every=every, clients=clients))
            phase.rss = _rss(proc.pid)
            phases.append(phase)
            print(f"{kind:>16}: {phase.answered} answered 200, {phase.unanswered} not "
                  f"({dict(sorted(phase.other.items()))}); p50 {percentile(phase.latencies, 0.5) * 1000:.1f} ms, "
                  f"p99 {percentile(phase.latencies, 0.99) * 1000:.1f} ms; hostile connections opened "
                  f"{phase.opened}, closed by the server {phase.closed_by_server}; RSS {phase.rss / 2**20:.0f} MB",
                  flush=True)
            if k < len(kinds):
                time.sleep(1)  # the server settles before the next kind
    except BaseException:
        print(f"the server's database and log are kept in {work}", file=sys.stderr, flush=True)
        raise
    finally:
        if fronted is not None:
            fronted.terminate()
            fronted.wait(timeout=20)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)
    _table(phases, start)
    return phases


def _table(phases: list[Phase], start: int) -> None:
    print(f"\n| hostile kind | sockets | answered 200 | not answered | p50 | p99 | answered / p99 against none "
          f"| hostile connections opened / closed by the server | RSS (start {start / 2**20:.0f} MB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = next((p for p in phases if p.sockets == 0 and p.answered), None)
    for p in phases:
        p50, p99 = percentile(p.latencies, 0.5) * 1000, percentile(p.latencies, 0.99) * 1000
        versus = "-"
        if base is not None and p is not base:
            ratio = percentile(p.latencies, 0.99) / percentile(base.latencies, 0.99)
            versus = f"x{p.answered / base.answered:.2f} / x{ratio:.2f}" if p.answered else "none answered"
        print(f"| {p.kind} | {p.sockets:,} | {p.answered} | {p.unanswered} | {p50:.1f} ms | {p99:.1f} ms | {versus} "
              f"| {p.opened:,} / {p.closed_by_server:,} | {p.rss / 2**20:.0f} MB |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated hostile kinds: {', '.join(KINDS)}")
    parser.add_argument("--sockets", type=int, default=200, help="hostile sockets of each kind at once")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of ordinary requests per kind")
    parser.add_argument("--every", type=float, default=4.0, help="seconds between a dripping socket's lines")
    parser.add_argument("--clients", type=int, default=4, help="ordinary clients at once")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose qoss to run (default: this one)")
    parser.add_argument("--front", default="qoss", help="comma-separated arms, one after another: qoss (clients "
                        "at qoss serve itself), haproxy (at HAProxy in front of it)")
    args = parser.parse_args(argv)
    fronts = args.front.split(",")
    if any(f not in ("qoss", "haproxy") for f in fronts):
        parser.error("--front: qoss, haproxy")
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"unknown kinds {unknown}: choose from {', '.join(KINDS)}")
    if not 0 <= args.sockets <= 20_000 or not 0 < args.seconds <= 600 or args.clients < 1:
        parser.error("--sockets 0..20000, --seconds 0..600, --clients at least 1")
    for front in fronts:
        run(kinds, sockets=args.sockets, seconds=args.seconds, every=args.every, clients=args.clients, root=args.root,
            front=front)


if __name__ == "__main__":
    main()
