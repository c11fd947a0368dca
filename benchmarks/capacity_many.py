"""Many tunnels on one gateway pair: set-up times, memory, the idle cost of watching them, teardown.

    .venv/bin/python -m benchmarks.capacity_many [--tunnels 1000] [--concurrency 1] [--quiet 60] [--budget 3600]
                                                 [--settle SECONDS]

One lab (two charons with kernel-libipsec in network namespaces) and one real ``qoss serve``
(uvicorn, SQLite, the service's defaults: the tunnel monitor on). Each tunnel protects its own
/32 on the left (10.10.x.y) to the right's inside address. In order:

1. a quiet interval of ``--quiet`` seconds with no tunnel: the server's CPU seconds
   (``/proc/PID/stat``, all its threads);
2. N tunnels brought up with ``POST /v1/tunnels``, ``--concurrency`` at a time: set-up p50/p99
   (each request's time to its 201);
3. the same quiet interval with the N tunnels up (after the monitor's checks of the new
   tunnels have settled): the server's CPU seconds again; the difference is what watching N
   tunnels costs (the monitor's event listeners, its resync of the gateways; no rekey falls in
   it: the lifetimes are hours);
4. every tunnel deleted, ``--concurrency`` at a time: the teardown's wall time;
5. a last quiet interval, ``--quiet`` but at least ``QOSS_MEMORY_RELEASE_AFTER`` (15 s by
   default) plus 5 s: long enough for the server to give back what it holds once no request
   has come for that long.

Before each reading the server is left alone for a while, so that what it still does on its
own (the monitor's checks of the tunnels just set up or torn down, the memory release) has
run: :data:`SETTLE` seconds, each replaced by ``--settle`` when given (a smoke run: 0).

RSS of the server is printed at each step: before, all up, after the listing of all N
(``GET /v1/tunnels``, once after set-up and once before teardown: a few KiB of JSON per tunnel,
whose building takes RSS of its own), before and after teardown, and after the last quiet
interval: what stays after that is held, not used (no request is running). RSS of both charons
(all up) is printed too, and, with 0 and with N tunnels up, the median of 5 bare VICI ``initiate``s of one more conn
(loaded beforehand, untimed; terminated and unloaded after): what charon alone takes then.
If not all N come up (the time budget, or 20 failures in a row), the run goes on with those that
did and prints what stopped it: the error of the last failure or the budget.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from app.domain.errors import GatewayError
from app.domain.tunnels import TunnelEnd, conn_payload
from benchmarks._harness import (
    Service,
    ThreadClients,
    all_tunnels,
    cpu_seconds,
    lab_and_service,
    left_sources,
    percentile,
    rss_kib,
)

MAX_FAILURES_IN_A_ROW = 20
#: The server's memory release runs after this many seconds without a request (its
#: ``QOSS_MEMORY_RELEASE_AFTER``, 15 by default).
RELEASE_AFTER = float(os.environ.get("QOSS_MEMORY_RELEASE_AFTER", "15"))
#: Seconds the server is left alone before a reading: after the warm-up and after the set-up
#: (the monitor checks each new tunnel), after the teardown, and past the memory release
#: before the last reading (the last quiet interval is ``--quiet`` but at least
#: RELEASE_AFTER + this).
SETTLE = {"warm-up": 2.0, "set-up": 5.0, "teardown": 2.0, "release": 5.0}
#: The suite of the bare initiates: what qoss negotiates for these tunnels (set from the warm-up).
SUITE: dict[str, str] = {}


def _charon_pid(pid: int) -> int:
    """The charon process of a lab host (its recorded pid execs into charon; else a child that is)."""
    if Path(f"/proc/{pid}/comm").read_text().strip() == "charon":
        return pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "charon":
                return int(child)
    raise RuntimeError(f"no charon under pid {pid}")


def _bare_initiate(svc: Service, source: str, rounds: int = 5) -> float:
    """Median ms of a bare VICI ``initiate`` of a conn loaded beforehand on both ends (the suite qoss picks)."""
    left, right = svc.lab.host("left"), svc.lab.host("right")
    gateways = {"left": left.gateway(120), "right": right.gateway(120)}
    times = []
    for i in range(rounds):
        name = f"bare-{i}"
        ends = {"left": TunnelEnd(left.ike_address, f"{name}.left", (f"{source}/32",)),
                "right": TunnelEnd(right.ike_address, f"{name}.right", (f"{right.inside_address}/32",))}
        psk = secrets.token_bytes(32)
        for me, peer in (("right", "left"), ("left", "right")):
            gateways[me].load_shared(name, psk, [ends[me].identity, ends[peer].identity])
            gateways[me].load_conn(name, conn_payload(
                name=name, local=ends[me], remote=ends[peer], ike_proposal=SUITE["ike"], esp_proposal=SUITE["esp"],
                ah_proposal=None, mode="tunnel", ike_lifetime=14400, child_lifetime=3600))
        try:
            start = time.perf_counter()
            gateways["left"].initiate(child=name, ike=name, timeout_ms=60_000)
            times.append((time.perf_counter() - start) * 1000)
        finally:
            with contextlib.suppress(GatewayError):
                gateways["left"].terminate(ike=name, force=True, timeout_ms=60_000)
            for gw in gateways.values():
                with contextlib.suppress(GatewayError):
                    gw.unload_conn(name)
                with contextlib.suppress(GatewayError):
                    gw.unload_shared(name)
    return statistics.median(times)


def _quiet_cpu(svc: Service, seconds: float) -> float:
    """The server's CPU seconds over ``seconds`` in which nothing is asked of it."""
    before = cpu_seconds(svc.pid)
    time.sleep(seconds)
    return cpu_seconds(svc.pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--tunnels", type=int, default=1000, help="tunnels to bring up (default 1000; goal 10000)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once, set-up and teardown (default 1)")
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds of each quiet interval (default 60)")
    parser.add_argument("--budget", type=float, default=3600.0,
                        help="seconds for bringing tunnels up (default 3600); teardown always runs")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds the server is left alone before each reading (default: 2 after the warm-up, "
                             "5 after the set-up, 2 after the teardown, 5 past the memory release)")
    args = parser.parse_args()
    settle = {step: seconds if args.settle is None else max(0.0, args.settle) for step, seconds in SETTLE.items()}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still clean up
    n = max(1, min(args.tunnels, 20_000))
    c = max(1, min(args.concurrency, 64))
    with lab_and_service() as svc:
        right = svc.lab.host("right")
        t0 = time.perf_counter()
        sources = left_sources(svc, n + 1)  # the last one: the bare initiates
        print(f"{n} source addresses on the left in {time.perf_counter() - t0:.1f} s", flush=True)
        clients = ThreadClients(svc, timeout=120)
        try:
            client = clients.get()
            for source in sources[:5]:  # warm-up (imports, caches, VICI sessions)
                r = client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                                     "local_ts": [f"{source}/32"],
                                                     "remote_ts": [f"{right.inside_address}/32"]})
                r.raise_for_status()
                SUITE.update(r.json()["proposals"])
                client.delete(f"/v1/tunnels/{r.json()['id']}").raise_for_status()
            bare0 = _bare_initiate(svc, sources[n])
            time.sleep(settle["warm-up"])  # the monitor's checks of the warm-up tunnels
            cpu_idle0 = _quiet_cpu(svc, args.quiet)
            rss_before = svc.rss_kib()
            charons = {name: _charon_pid(pid) for name, pid in svc.lab.pids.items()}
            charon_before = {name: rss_kib(pid) for name, pid in charons.items()}
            print(f"quiet with 0 tunnels: server CPU {cpu_idle0:.2f} s in {args.quiet:g} s", flush=True)

            times: list[float] = []
            ids: list[str] = []
            lock = threading.Lock()
            stop: list[str] = []
            in_a_row = [0]
            last_error = [""]
            deadline = time.monotonic() + args.budget

            def create(i: int) -> None:
                if stop:
                    return
                if time.monotonic() > deadline:
                    stop.append(f"time budget of {args.budget:g} s reached")
                    return
                body = {"initiator": "left", "responder": "right", "local_ts": [f"{sources[i]}/32"],
                        "remote_ts": [f"{right.inside_address}/32"]}
                start = time.perf_counter()
                try:
                    r = clients.get().post("/v1/tunnels", json=body)
                    error = None if r.status_code == 201 else f"{r.status_code} {r.text[:300]}"
                except httpx.HTTPError as exc:
                    r, error = None, f"{type(exc).__name__}: {exc}"
                elapsed = (time.perf_counter() - start) * 1000
                with lock:
                    if error is None and r is not None:
                        times.append(elapsed)
                        ids.append(r.json()["id"])
                        in_a_row[0] = 0
                        if len(ids) % 1000 == 0:
                            print(f"  {len(ids)} up, last 1000: p50 {statistics.median(times[-1000:]):.1f} ms, "
                                  f"server RSS {svc.rss_kib() / 1024:.0f} MiB", flush=True)
                    else:
                        last_error[0] = f"tunnel {i}: {error}"
                        in_a_row[0] += 1
                        if in_a_row[0] >= MAX_FAILURES_IN_A_ROW:
                            stop.append(f"{MAX_FAILURES_IN_A_ROW} failures in a row; the last: {last_error[0]}")

            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                list(pool.map(create, range(n)))
            up_seconds = time.perf_counter() - t0
            rss_up = svc.rss_kib()
            charon_up = {name: rss_kib(pid) for name, pid in charons.items()}
            listed, listed_bytes = all_tunnels(client)
            rss_listed = svc.rss_kib()
            states: dict[str, int] = {}
            for t in listed:
                states[t["state"]] = states.get(t["state"], 0) + 1
            print(f"{len(ids)} up in {up_seconds:.1f} s; listed {states}", flush=True)
            time.sleep(settle["set-up"])  # the monitor's checks of the last tunnels
            cpu_idle_n = _quiet_cpu(svc, args.quiet)
            print(f"quiet with {len(ids)} tunnels: server CPU {cpu_idle_n:.2f} s in {args.quiet:g} s", flush=True)
            bare_n = _bare_initiate(svc, sources[n])
            still_up = sum(1 for t in all_tunnels(client)[0] if t["state"] == "up")
            rss_before_teardown = svc.rss_kib()

            failed_deletes: list[str] = []

            def delete(tunnel_id: str) -> None:
                try:
                    clients.get().delete(f"/v1/tunnels/{tunnel_id}").raise_for_status()
                except httpx.HTTPError as exc:
                    with lock:
                        failed_deletes.append(f"{tunnel_id}: {exc}")

            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                list(pool.map(delete, ids))
            teardown = time.perf_counter() - t0
            time.sleep(settle["teardown"])
            rss_after = svc.rss_kib()
            left_over = len(all_tunnels(client)[0])
            last_quiet = max(args.quiet, RELEASE_AFTER + settle["release"])
            time.sleep(last_quiet)
            rss_quiet = svc.rss_kib()
        finally:
            clients.close()

    print(f"\ncapacity_many: {n} tunnels asked on one gateway pair, {c} at a time; quiet intervals {args.quiet:g} s")
    print(f"  up: {len(ids)} of {n} in {up_seconds:.1f} s ({len(ids) / up_seconds:.1f}/s)"
          + (f"; stopped: {stop[0]}" if stop else "") + (f"; last failure: {last_error[0]}" if last_error[0] else ""))
    if times:
        print(f"  set-up: p50 {statistics.median(times):.1f} ms, p99 {percentile(times, 99):.1f} ms, "
              f"max {max(times):.1f} ms; first 100 p50 {statistics.median(times[:100]):.1f} ms, "
              f"last 100 p50 {statistics.median(times[-100:]):.1f} ms")
    print(f"  server RSS: before {rss_before / 1024:.1f} MiB, all up {rss_up / 1024:.1f} MiB "
          f"({(rss_up - rss_before) / max(1, len(ids)):.1f} KiB per tunnel), after listing all "
          f"({listed_bytes / 2**20:.1f} MiB of JSON) {rss_listed / 1024:.1f} MiB, before teardown "
          f"{rss_before_teardown / 1024:.1f} MiB, after teardown {rss_after / 1024:.1f} MiB, "
          f"after {last_quiet:g} s quiet {rss_quiet / 1024:.1f} MiB")
    print("  charon RSS: " + ", ".join(
        f"{name} {charon_before[name] / 1024:.1f} -> {charon_up[name] / 1024:.1f} MiB "
        f"({(charon_up[name] - charon_before[name]) / max(1, len(ids)):.1f} KiB per tunnel)" for name in charons))
    print(f"  bare VICI initiate of one more conn (charon alone): {bare0:.1f} ms with 0 up, {bare_n:.1f} ms with "
          f"{len(ids)} up")
    print(f"  server CPU over {args.quiet:g} s quiet: {cpu_idle0:.2f} s with 0 tunnels, {cpu_idle_n:.2f} s with "
          f"{len(ids)} up (difference {cpu_idle_n - cpu_idle0:+.2f} s); {still_up} still up after it")
    print(f"  teardown of all {len(ids)}: {teardown:.1f} s ({len(ids) / teardown if teardown else 0:.1f}/s); "
          f"{len(failed_deletes)} failed; {left_over} records left")
    for line in failed_deletes[:3]:
        print(f"    {line[:300]}")


if __name__ == "__main__":
    main()
