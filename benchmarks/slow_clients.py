"""Slow clients at one `qoss serve` process: how many legitimate requests it answers, and how
fast, while hundreds or thousands of connections send their request heads a line at a time.

    .venv/bin/python -m benchmarks.slow_clients                          # 0, 260, then 2,000 slow sockets
    .venv/bin/python -m benchmarks.slow_clients --sockets 20 --seconds 3   # a smoke run
    .venv/bin/python -m benchmarks.slow_clients --root /tmp/other-checkout # another checkout's code

For each count N in --sockets, N connections (from 127.0.0.2 and up, loopback only) each send a
request line and then one header line every --every seconds and never the end of the head; one
the server closes is opened again at once, as an attacker would. Once all N are open, --clients
legitimate clients each send `GET /v1/rating-tables/standards-2026/revisions` on a new connection
(the case the slow ones used to starve), one after another for --seconds, each with a 10 s
timeout. Printed per count: the requests answered 200, those not answered (timeouts, errors),
their p50 and p99 latency, and how often the server closed a slow connection. The server runs
with the service's defaults (256 connections, a 10 s header timeout) on SQLite; the process's
open-file limit is raised to its hard limit first (the server inherits it).
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
    """One count of slow sockets: what the legitimate clients saw, and what the slow ones did."""

    sockets: int
    latencies: list[float] = field(default_factory=list)  # seconds, of the requests answered 200
    other: dict[str, int] = field(default_factory=dict)  # what the rest got: a status or an error's name
    opened: int = 0
    closed_by_server: int = 0

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
    """The loopback address the ``i``-th slow socket connects from: 127.0.0.2 and up, 250 to each."""
    n = 2 + i // 250
    return f"127.0.{n // 250}.{n % 250 + (1 if n // 250 else 0)}"


def _raise_open_files(needed: int) -> int:
    """Raise the soft open-file limit to the hard one if ``needed`` descriptors do not fit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def _slow(host: str, port: int, i: int, every: float, stop: asyncio.Event, phase: Phase,
                opening: asyncio.Semaphore) -> None:
    """One slow client: a request line, then a header line every ``every`` s, reconnecting when closed."""
    while not stop.is_set():
        async with opening:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, local_addr=(source_address(i), 0)), 10)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.5)
                continue
        phase.opened += 1
        try:
            writer.write(f"GET {PATH} HTTP/1.1\r\nHost: qoss\r\n".encode())
            line = 0
            while not stop.is_set():
                try:
                    got = await asyncio.wait_for(reader.read(4096), every)
                except TimeoutError:
                    writer.write(f"X-Slow-{line}: {line}\r\n".encode())
                    line += 1
                    continue
                if not got or got.startswith(b"HTTP/"):  # closed (or answered and then closed) by the server
                    phase.closed_by_server += 1
                    break
        except OSError:
            phase.closed_by_server += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _legitimate(base: str, seconds: float, phase: Phase) -> None:
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


async def _phase(base: str, n: int, *, seconds: float, every: float, clients: int) -> Phase:
    host, port = base.removeprefix("http://").split(":")
    phase = Phase(sockets=n)
    stop = asyncio.Event()
    opening = asyncio.Semaphore(_OPENING)
    slow = [asyncio.create_task(_slow(host, int(port), i, every, stop, phase, opening)) for i in range(n)]
    try:
        for _ in range(600):  # all N open, 60 s at most
            if phase.opened >= n:
                break
            await asyncio.sleep(0.1)
        await asyncio.gather(*(_legitimate(base, seconds, phase) for _ in range(clients)))
    finally:
        stop.set()
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
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


def run(counts: list[int], *, seconds: float, every: float, clients: int, root: Path) -> list[Phase]:
    """Each count of slow sockets in turn at one fresh server; its phases."""
    limit = _raise_open_files(2 * max(counts, default=0) + 1024)
    work = Path(tempfile.mkdtemp(prefix="qoss-slow-clients-"))
    base, proc = _serve(root, work)
    print(f"qoss serve ({root}) on SQLite with its defaults; open-file limit {limit}; slow sockets send a header "
          f"line every {every:g} s; {clients} legitimate client(s), {seconds:g} s per count", flush=True)
    phases = []
    try:
        for k, n in enumerate(counts):
            phase = asyncio.run(_phase(base, n, seconds=seconds, every=every, clients=clients))
            phases.append(phase)
            print(f"{n:>6} slow sockets: {phase.answered} answered 200, {phase.unanswered} not "
                  f"({dict(sorted(phase.other.items()))}); p50 {percentile(phase.latencies, 0.5) * 1000:.1f} ms, "
                  f"p99 {percentile(phase.latencies, 0.99) * 1000:.1f} ms; slow connections opened "
                  f"{phase.opened}, closed by the server {phase.closed_by_server}", flush=True)
            if k < len(counts) - 1:
                time.sleep(1)  # the server settles before the next count
    except BaseException:
        print(f"the server's database and log are kept in {work}", file=sys.stderr, flush=True)
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)
    _table(phases)
    return phases


def _table(phases: list[Phase]) -> None:
    print("\n| slow sockets | answered 200 | not answered | p50 | p99 | slow ones closed by the server |")
    print("|---|---|---|---|---|---|")
    for p in phases:
        print(f"| {p.sockets:,} | {p.answered} | {p.unanswered} | {percentile(p.latencies, 0.5) * 1000:.1f} ms | "
              f"{percentile(p.latencies, 0.99) * 1000:.1f} ms | {p.closed_by_server} |")
    base = next((p for p in phases if p.sockets == 0 and p.answered), None)
    if base is not None:
        for p in phases:
            if p is not base:
                print(f"  {p.sockets:,} slow sockets: answered x{p.answered / base.answered:.2f} of none, "
                      f"p99 x{percentile(p.latencies, 0.99) / percentile(base.latencies, 0.99):.2f}"
                      if p.answered else f"  {p.sockets:,} slow sockets: none answered")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", default="0,260,2000", help="comma-separated counts of slow sockets")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of legitimate requests per count")
    parser.add_argument("--every", type=float, default=4.0, help="seconds between a slow socket's header lines")
    parser.add_argument("--clients", type=int, default=4, help="legitimate clients at once")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose qoss to run (default: this one)")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.sockets.split(",")]
    if any(n < 0 or n > 20_000 for n in counts) or not 0 < args.seconds <= 600 or args.clients < 1:
        parser.error("--sockets 0..20000 each, --seconds 0..600, --clients at least 1")
    run(counts, seconds=args.seconds, every=args.every, clients=args.clients, root=args.root)


if __name__ == "__main__":
    main()
