"""Bursts of concurrent requests at one `qoss serve` process: what it answers, how fast
/healthz stays, and whether its memory comes back.

    .venv/bin/python -m benchmarks.overload                 # SQLite in a temporary directory
    .venv/bin/python -m benchmarks.overload --postgres URL  # an existing PostgreSQL database

Each burst sends N requests at once (half anonymous `POST /v1/negotiations`, half anonymous
`GET /v1/rating-tables/standards-2026/revisions`, one in ten of them authenticated with a
token, and every 50th an authenticated rating edit), each with a 30 s client timeout, while a
probe asks `/healthz` every 50 ms on one kept connection and another every 0.2 s on a new
connection each time, as a load balancer's check (answered from the waiting room at once; with
`QOSS_WAITING_ROOM=false` it waits its turn behind the burst's in the listen backlog). Printed
per burst: answers by status, requests without an answer, the slowest /healthz during and right
after (and on new connections during), and the server's RSS at start, at its peak, 2 s after
and after --quiet seconds without requests (a fresh server is left alone for --settle seconds,
2 by default, before its RSS at start is read). The bursts are sent to one fresh server per
--arm, one after another (default: the memory release off, then the defaults), and a table compares
them. The service's defaults are used otherwise (256 connections and 64 requests in flight at
once, a 0.5 s pool timeout, memory given back after 15 quiet seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks._harness import prepared_database

ROOT = Path(__file__).resolve().parent.parent
OFF = {"QOSS_MEMORY_RELEASE": "off"}  # the environment that turns the memory release off
NEGOTIATION = {"rating_table": "standards-2026", "peers": [{"name": "app", "min_levels": {"confidentiality": 8}}]}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _burst(base: str, n: int, token: str, pid: int) -> dict[str, object]:
    limits = httpx.Limits(max_connections=n + 20, max_keepalive_connections=0)
    health: list[float] = []
    fresh: list[float] = []  # /healthz on a new connection each time, as a load balancer's check
    peak = _rss_mb(pid)
    done = threading.Event()
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        async def one(i: int) -> tuple[str, int | str]:
            auth = {"Authorization": f"Bearer {token}"} if i % 10 == 0 else {}
            kind = "edit" if i % 50 == 0 else ("negotiation" if i % 2 else "read") + (" (token)" if auth else "")
            try:
                if i % 50 == 0:
                    r = await client.get("/v1/rating-tables/esaf-2006")
                    rev = r.headers.get("etag", '"1"')
                    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"performance": 8},
                                           headers={"Authorization": f"Bearer {token}", "If-Match": rev})
                elif i % 2:
                    r = await client.post("/v1/negotiations", json=NEGOTIATION, headers=auth)
                else:
                    r = await client.get("/v1/rating-tables/standards-2026/revisions", headers=auth)
                return kind, r.status_code
            except httpx.HTTPError as exc:
                return kind, type(exc).__name__

        def probe() -> None:  # its own thread and client: the burst's event loop does not delay it
            nonlocal peak
            with httpx.Client(base_url=base, timeout=30) as own:
                while not done.is_set():
                    t = time.perf_counter()
                    try:
                        own.get("/healthz")
                        health.append(time.perf_counter() - t)
                    except httpx.HTTPError:
                        health.append(float("inf"))
                    peak = max(peak, _rss_mb(pid))
                    time.sleep(0.05)

        def probe_fresh() -> None:  # every 0.2 s on a connection of its own, as a load balancer's check
            while not done.is_set():
                t = time.perf_counter()
                try:
                    httpx.get(f"{base}/healthz", timeout=30)
                    fresh.append(time.perf_counter() - t)
                except httpx.HTTPError:
                    fresh.append(float("inf"))
                time.sleep(0.2)

        prober = asyncio.create_task(asyncio.to_thread(probe))
        fresh_prober = asyncio.create_task(asyncio.to_thread(probe_fresh))
        started = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - started
        done.set()
        await prober
        await fresh_prober
        after: list[float] = []
        for _ in range(10):
            t = time.perf_counter()
            await client.get("/healthz", timeout=10)
            after.append(time.perf_counter() - t)
    return {"statuses": Counter(status for _, status in results), "by_kind": Counter(results), "seconds": elapsed,
            "health_max_during": max(health, default=0.0), "health_max_after": max(after), "rss_peak": peak,
            "health_fresh_max": max(fresh, default=0.0)}


@dataclass
class Row:
    """One burst's figures in one arm."""

    n: int
    statuses: Counter[int | str]
    by_kind: Counter[tuple[str, int | str]]
    seconds: float
    health_during: float
    health_after: float
    health_fresh: float
    start: float
    peak: float
    after: float
    quiet: float

    @property
    def unanswered(self) -> int:
        return sum(v for k, v in self.statuses.items() if isinstance(k, str))


def _serve_arm(name: str, extra: dict[str, str], bursts: list[int], quiet: float,
               postgres: str | None, settle: float = 2.0) -> list[Row]:
    """A fresh `qoss serve` (its own database) with ``extra`` in its environment, ``bursts`` at it."""
    work = Path(tempfile.mkdtemp(prefix="qoss-overload-"))
    url = postgres or f"sqlite:///{work / 'q.db'}"
    env = {**os.environ, "QOSS_DATABASE_URL": url, "QOSS_RECONCILE_ON_START": "false",
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning", **extra}
    qoss = [sys.executable, "-m", "app.cli"]  # this checkout's code, whatever the venv's install points at
    token = prepared_database(url, f"overload-{name}", extra)
    port = _port()
    with (work / "serve.log").open("wb") as log:
        proc = subprocess.Popen([*qoss, "serve", "--port", str(port)], env=env, stdout=log, stderr=log, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    rows: list[Row] = []
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        time.sleep(settle)  # start-up's own work settles
        start = _rss_mb(proc.pid)
        settings = " ".join(f"{k}={v}" for k, v in extra.items()) or "defaults"
        print(f"[{name}] qoss serve on {'PostgreSQL' if postgres else 'SQLite'} ({settings}), "
              f"RSS at start {start:.0f} MB", flush=True)
        for n in bursts:
            r = asyncio.run(_burst(base, n, token, proc.pid))
            time.sleep(2)
            after = _rss_mb(proc.pid)
            time.sleep(max(0.0, quiet - 2))
            row = Row(n=n, statuses=r["statuses"], by_kind=r["by_kind"], seconds=r["seconds"],  # type: ignore[arg-type]
                      health_during=r["health_max_during"], health_after=r["health_max_after"],  # type: ignore[arg-type]
                      health_fresh=r["health_fresh_max"],  # type: ignore[arg-type]
                      start=start, peak=r["rss_peak"], after=after, quiet=_rss_mb(proc.pid))  # type: ignore[arg-type]
            rows.append(row)
            print(f"[{name}] burst {n}: {dict(sorted(row.statuses.items(), key=str))} in {row.seconds:.1f} s; "
                  f"500s {row.statuses.get(500, 0)}, unanswered {row.unanswered}; "
                  f"/healthz max {row.health_during * 1000:.0f} ms during, "
                  f"{row.health_after * 1000:.0f} ms right after, {row.health_fresh * 1000:.0f} ms on new "
                  f"connections during; RSS peak {row.peak:.0f} MB, "
                  f"2 s after {row.after:.0f} MB ({row.after / start:.2f}x start), "
                  f"{quiet:.0f} s after {row.quiet:.0f} MB ({row.quiet / start:.2f}x start)", flush=True)
            for kind in sorted({k for k, _ in row.by_kind}):
                print(f"  {kind}: " + ", ".join(f"{status} x {count}" for (k, status), count
                                                 in sorted(row.by_kind.items(), key=str) if k == kind))
    except BaseException:
        print(f"[{name}] the server's database and log are kept in {work}", file=sys.stderr, flush=True)
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)
    return rows


def _arm(text: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:VAR=VALUE VAR=VALUE`` (``off`` alone has its own meaning: see --arm)."""
    name, _, rest = text.partition(":")
    env = dict(item.split("=", 1) for item in rest.split())
    if name == "off" and not rest:
        env = dict(OFF)
    return name, env


def _table(arms: dict[str, list[Row]], quiet: float) -> None:
    print(f"\n| arm | burst | 200s | 429s | 503s | 500s | unanswered | /healthz max during / after / new "
          f"connections during | RSS start → peak → 2 s → {quiet:.0f} s after (x start) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in arms.items():
        for r in rows:
            print(f"| {name} | {r.n:,} | {r.statuses.get(200, 0)} | {r.statuses.get(429, 0)} | "
                  f"{r.statuses.get(503, 0)} | {r.statuses.get(500, 0)} | {r.unanswered} | "
                  f"{r.health_during * 1000:.0f} / {r.health_after * 1000:.0f} / {r.health_fresh * 1000:.0f} ms | "
                  f"{r.start:.0f} → {r.peak:.0f} → {r.after:.0f} → {r.quiet:.0f} MB (x{r.quiet / r.start:.2f}) |")
    names = list(arms)
    if len(names) < 2:
        return
    base = names[0]
    print(f"\nratios against {base} (same burst), each arm: RSS {quiet:.0f} s after / its start; 200s; "
          "slowest /healthz during")
    for name in names[1:]:
        for a, b in zip(arms[base], arms[name], strict=False):
            print(f"  {name} vs {base}, burst {a.n:,}: RSS after x{b.quiet / b.start:.2f} vs x{a.quiet / a.start:.2f} "
                  f"({(b.quiet / b.start) / (a.quiet / a.start):.2f}); "
                  f"200s {b.statuses.get(200, 0)} vs {a.statuses.get(200, 0)}; "
                  f"/healthz {b.health_during * 1000:.0f} vs {a.health_during * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="SQLAlchemy URL of a PostgreSQL database to use instead of SQLite")
    parser.add_argument("--bursts", default="300,3000", help="comma-separated burst sizes")
    parser.add_argument("--quiet", type=float, default=30.0,
                        help="seconds without requests after each burst before RSS is read again (default 30)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds each fresh server is left alone before its RSS at start is read (default 2)")
    parser.add_argument("--arm", action="append", default=[],
                        help="a server to run the bursts at, one after another: 'NAME:VAR=VALUE VAR=VALUE' sets "
                             "its environment; 'off' alone is the memory release off, 'on' alone the defaults "
                             "(default: off, then on)")
    args = parser.parse_args()
    bursts = [int(x) for x in args.bursts.split(",")]
    named = [_arm(a) for a in (args.arm or ["off", "on"])]
    arms = dict(named)
    if len(arms) < len(named):  # each arm's rows are kept under its name: a second one would replace the first
        parser.error("each --arm needs a name of its own (e.g. 'on2:' for the defaults again)")
    results = {name: _serve_arm(name, env, bursts, args.quiet, args.postgres, max(0.0, args.settle))
               for name, env in arms.items()}
    _table(results, args.quiet)


if __name__ == "__main__":
    main()
