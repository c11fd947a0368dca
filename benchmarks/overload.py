"""Bursts of concurrent requests at one `qoss serve` process: what it answers, how fast
/healthz stays, and whether its memory comes back.

    .venv/bin/python -m benchmarks.overload                 # SQLite in a temporary directory
    .venv/bin/python -m benchmarks.overload --postgres URL  # an existing PostgreSQL database

Each burst sends N requests at once (half anonymous `POST /v1/negotiations`, half anonymous
`GET /v1/rating-tables/standards-2026/revisions`, one in ten of them authenticated with a
token, and every 50th an authenticated rating edit), each with a 30 s client timeout, while a
probe asks `/healthz` every 50 ms. Printed per burst: answers by status, requests without an
answer, the slowest /healthz during and right after, and the server's RSS at start, at its
peak and after. The service's defaults are used (64 in flight, a 0.5 s pool timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
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

        prober = asyncio.create_task(asyncio.to_thread(probe))
        started = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - started
        done.set()
        await prober
        after: list[float] = []
        for _ in range(10):
            t = time.perf_counter()
            await client.get("/healthz", timeout=10)
            after.append(time.perf_counter() - t)
    return {"statuses": Counter(status for _, status in results), "by_kind": Counter(results), "seconds": elapsed,
            "health_max_during": max(health, default=0.0), "health_max_after": max(after), "rss_peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="SQLAlchemy URL of a PostgreSQL database to use instead of SQLite")
    parser.add_argument("--bursts", default="300,3000", help="comma-separated burst sizes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qoss-overload-"))
    url = args.postgres or f"sqlite:///{work / 'q.db'}"
    env = {**os.environ, "QOSS_DATABASE_URL": url, "QOSS_RECONCILE_ON_START": "false",
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning"}
    qoss = [sys.executable, "-m", "app.cli"]  # this checkout's code, whatever the venv's install points at
    subprocess.run([*qoss, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=ROOT)
    token = subprocess.run([*qoss, "token", "create", "--name", "overload", "--scopes", "admin", "--plain"],
                           env=env, check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    port = _port()
    with (work / "serve.log").open("wb") as log:
        proc = subprocess.Popen([*qoss, "serve", "--port", str(port)], env=env, stdout=log, stderr=log, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        start = _rss_mb(proc.pid)
        print(f"qoss serve on {'PostgreSQL' if args.postgres else 'SQLite'}, RSS at start {start:.0f} MB")
        for n in (int(x) for x in args.bursts.split(",")):
            r = asyncio.run(_burst(base, n, token, proc.pid))
            time.sleep(2)
            statuses = r["statuses"]
            assert isinstance(statuses, Counter)
            unanswered = sum(v for k, v in statuses.items() if isinstance(k, str))
            print(f"burst {n}: {dict(sorted(statuses.items(), key=str))} in {r['seconds']:.1f} s; "
                  f"500s {statuses.get(500, 0)}, unanswered {unanswered}; "
                  f"/healthz max {r['health_max_during'] * 1000:.0f} ms during, "
                  f"{r['health_max_after'] * 1000:.0f} ms right after; "
                  f"RSS peak {r['rss_peak']:.0f} MB, after {_rss_mb(proc.pid):.0f} MB "
                  f"({_rss_mb(proc.pid) / start:.2f}x start)")
            by_kind = r["by_kind"]
            assert isinstance(by_kind, Counter)
            for kind in sorted({k for k, _ in by_kind}):
                print(f"  {kind}: " + ", ".join(f"{status} x {count}" for (k, status), count
                                                 in sorted(by_kind.items(), key=str) if k == kind))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
