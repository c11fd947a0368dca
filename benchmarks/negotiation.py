"""Negotiation speed: in-process decision time, and HTTP throughput against a trivial endpoint.

    .venv/bin/python benchmarks/negotiation.py [--decisions 5000] [--requests 3000] [--concurrency 8] [--warmup 200]

1. In-process: ``negotiate`` over the full catalogue (standards-2026, all 80 keywords
   candidates) with 3 peers; p50/p99 of single decisions. Goal: p50 <= 0.5 ms.
2. HTTP: one uvicorn (SQLite, migrated, shipped tables) on 127.0.0.1; the same client
   alternates rounds of POST /v1/negotiations and GET /livez (the trivial endpoint of the
   same app) so both see the same machine state. Goal: negotiation rate >= 0.5 x trivial.
   The anonymous negotiation limits are raised for the server it starts: this measures the
   negotiation, not the limiter (which would answer most of the burst with 429).
Each part first warms up, untimed: ``--warmup`` decisions, and as many requests of each kind.
Every loop is bounded in count and time; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.adapters.files import load_rating_table  # noqa: E402
from app.domain.negotiation import NegotiationRequest, Peer, negotiate  # noqa: E402
from app.domain.policies import Policy  # noqa: E402
from app.settings import SHIPPED_RATINGS_DIR  # noqa: E402

BODY = {
    "peers": [
        {"name": "app", "min_levels": {"confidentiality": 8, "integrity": 5}},
        {"name": "gw", "min_levels": {"integrity": 7, "key_exchange": 6}, "objective_id": 3, "forbids": ["md5"]},
        {"name": "branch", "min_levels": {"confidentiality": 6, "key_exchange": 8}},
    ],
    "traffic": {"packet_size": 1400},
}


def in_process(n: int, warmup: int = 200) -> dict[str, float]:
    table = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
    peers = [
        Peer(p["name"], Policy.from_dict({k: v for k, v in p.items() if k in ("min_levels", "objective_id")}), table,
             forbids=frozenset(p.get("forbids", [])))
        for p in BODY["peers"]
    ]
    request = NegotiationRequest(peers=peers, table=table, default_table=table)
    for _ in range(warmup):
        negotiate(request)
    samples = []
    deadline = time.monotonic() + 60
    for _ in range(n):
        t0 = time.perf_counter_ns()
        negotiate(request)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        if time.monotonic() > deadline:
            break
    samples.sort()
    return {
        "n": len(samples),
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[int(len(samples) * 0.99) - 1],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def rate(client: httpx.AsyncClient, method: str, path: str, n: int, concurrency: int,
               json: object | None = None) -> float:
    remaining = n
    errors = 0

    async def worker() -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            r = await client.request(method, path, json=json)
            if r.status_code != 200:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout=120)
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{errors} non-200 answers from {path}")
    return n / elapsed


async def http_bench(requests: int, concurrency: int, warmup: int = 200) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "QOSS_DATABASE_URL": f"sqlite:///{tmp}/bench.db", "QOSS_LOG_LEVEL": "warning",
               "QOSS_NEGOTIATION_RATE": "1000000", "QOSS_NEGOTIATION_BURST": "1000000",
               "QOSS_NEGOTIATION_TOTAL_RATE": "1000000", "QOSS_NEGOTIATION_TOTAL_BURST": "1000000"}
        server = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for _ in range(300):
                    try:
                        if (await client.get("/livez")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)
                else:
                    raise RuntimeError("server did not start")
                if warmup > 0:
                    await rate(client, "POST", "/v1/negotiations", warmup, concurrency, BODY)
                    await rate(client, "GET", "/livez", warmup, concurrency)
                neg, triv = [], []
                rounds = 3
                for _ in range(rounds):
                    neg.append(await rate(client, "POST", "/v1/negotiations", requests // rounds, concurrency, BODY))
                    triv.append(await rate(client, "GET", "/livez", requests // rounds, concurrency))
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    n, t = statistics.median(neg), statistics.median(triv)
    return {"negotiation_rps": n, "trivial_rps": t, "ratio": n / t}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=200,
                        help="untimed decisions, and requests of each kind, before the timed ones (default 200)")
    args = parser.parse_args()
    warmup = max(0, args.warmup)
    ip = in_process(args.decisions, warmup)
    print(f"in-process negotiate, 3 peers, full catalogue: n={ip['n']} "
          f"p50={ip['p50_ms']:.3f} ms p99={ip['p99_ms']:.3f} ms (goal p50 <= 0.5 ms)")
    h = asyncio.run(http_bench(args.requests, args.concurrency, warmup))
    print(f"HTTP under uvicorn, concurrency {args.concurrency}: "
          f"POST /v1/negotiations {h['negotiation_rps']:.0f} req/s, "
          f"GET /livez {h['trivial_rps']:.0f} req/s, ratio {h['ratio']:.2f} (goal >= 0.5)")


if __name__ == "__main__":
    main()
