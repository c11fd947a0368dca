"""A peered tunnel's set-up against a local one, in the same rounds on the same two charons.

    .venv/bin/python -m benchmarks.peered_setup                       # 20 rounds, then 1,000 of each
    .venv/bin/python -m benchmarks.peered_setup --rounds 3 --many 20  # a smoke run

One lab (two charons in network namespaces, kernel-libipsec) and two ``qoss serve`` on SQLite,
each with a database, rating tables and policies of its own: site A drives both charons
(``left`` and ``right``, so it can also make a local tunnel), site B drives ``right`` alone, and
each is registered as the other's peer. Each round, taking turns: a local tunnel
(``POST /v1/tunnels`` left -> right at A: negotiate, load both charons, initiate, verify) and a
peered one (left -> ``gw-b@site-b`` at A: the offer, B's choice and load, A's load, initiate
and verification, the confirm and B's verification), each timed by the client until its 201,
then deleted (not timed). Printed: the medians and their ratio (goal: peered <= 1.3 x local),
and for each kind the CPU time each process (both services, both charons) used from a
set-up's request to its 201, the mean over the rounds.

``--many N`` then brings up N tunnels of each kind with ``--concurrency`` clients (each tunnel
protecting a /32 of its own on the left), all of one kind then all of the other, and prints
for each: how many came up, how many failed, p50 and p99 of the set-up, and the wall time;
then takes them all down.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks._harness import percentile, prepared_database, serve_qoss

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Site:
    base: str
    headers: dict[str, str]
    proc: subprocess.Popen[bytes] | None  # None: a server someone else runs


def _serve(state: Path, name: str, lab_dir: Path) -> Site:
    where = state / name
    where.mkdir()
    db_url = f"sqlite:///{where}/qoss.db"
    env = {**os.environ, "QOSS_DATABASE_URL": db_url, "QOSS_LOG_LEVEL": "warning", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_TUNNEL_RATE": "100000", "QOSS_TUNNEL_BURST": "100000",
           "QOSS_VICI_SOCKET_DIRS": f'["{lab_dir}"]', "QOSS_PEER_NAME": name, "QOSS_STATE_DIR": str(where / "state"),
           "QOSS_AGENT_RATE": "100000", "QOSS_AGENT_BURST": "100000", "QOSS_PEER_RATE": "100000",
           "QOSS_PEER_BURST": "100000"}
    base, proc = serve_qoss(env, where / "server.log")
    token = prepared_database(db_url, env={"QOSS_STATE_DIR": str(where / "state")})
    return Site(base, {"Authorization": f"Bearer {token}"}, proc)


def _gateway(site: Site, name: str, host: Any) -> None:
    r = httpx.post(f"{site.base}/v1/gateways", headers=site.headers, timeout=30, json={
        "name": name, "vici_socket": host.vici_socket, "ike_address": host.ike_address,
        "inside_networks": [f"{host.inside_address}/32"]})
    r.raise_for_status()


def _peer(site: Site, other: Site, other_name: str, gateway: str, networks: list[str]) -> None:
    identity = httpx.get(f"{other.base}/v1/peering/identity", headers=other.headers, timeout=30).json()
    r = httpx.post(f"{site.base}/v1/peers", headers=site.headers, timeout=30, json={
        "name": other_name, "url": other.base, "sign_public_key": identity["sign_public_key"],
        "kem_public_key": identity["kem_public_key"], "gateways": [gateway], "networks": networks})
    r.raise_for_status()


def _stop(site: Site) -> None:
    if site.proc is None:
        return
    site.proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        site.proc.wait(timeout=10)
    if site.proc.poll() is None:
        site.proc.kill()


@contextlib.contextmanager
def far_site(a: Site, lab: Any, state: Path, *, a_gateway: str = "left") -> Iterator[Site]:
    """Site B beside site A (``QOSS_PEER_NAME=site-a``) on A's lab: its own ``qoss serve`` on
    SQLite under ``state/site-b``, driving the right charon as ``gw-b``; each registered as the
    other's peer (A allows B its ``a_gateway``). Stopped on exit."""
    right = lab.host("right")
    b = _serve(state, "site-b", lab.state_dir)
    try:
        _gateway(b, "gw-b", right)
        _peer(a, b, "site-b", a_gateway, ["10.0.0.0/8"])
        _peer(b, a, "site-a", "gw-b", [f"{right.inside_address}/32"])
        yield b
    finally:
        _stop(b)


@contextlib.contextmanager
def _sites() -> Iterator[tuple[Site, Site, Any]]:
    from app.lab.hosts import Lab
    state = Path(tempfile.mkdtemp(prefix="qoss-peered-", dir="/tmp"))
    lab = Lab(state / "lab", prefix=f"qp{os.getpid() % 10000}-{uuid.uuid4().hex[:3]}")
    a: Site | None = None
    try:
        lab.up()
        left, right = lab.host("left"), lab.host("right")
        a = _serve(state, "site-a", state / "lab")
        _gateway(a, "left", left)
        _gateway(a, "right", right)
        with far_site(a, lab, state) as b:
            yield a, b, lab
    finally:
        if a is not None:
            _stop(a)
        lab.down()
        shutil.rmtree(state, ignore_errors=True)


_KINDS = {"local": "right", "peered": "gw-b@site-b"}


def _one(client: httpx.Client, kind: str, local_ts: list[str] | None = None) -> tuple[float, str | None]:
    body: dict[str, Any] = {"initiator": "left", "responder": _KINDS[kind]}
    if local_ts:
        body["local_ts"] = local_ts
    started = time.perf_counter()
    r = client.post("/v1/tunnels", json=body)
    took = time.perf_counter() - started
    if r.status_code != 201:
        return took, None
    return took, str(r.json()["id"])


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid``'s threads have used so far (``/proc/PID/task/*/schedstat``:
    nanoseconds on a CPU, counted by the scheduler, not sampled by the tick); seconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def rounds(a: Site, n: int, processes: dict[str, int] | None = None,
           ) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """``n`` rounds, the kinds taking turns: each kind's set-up times (seconds), and the CPU time
    each of ``processes`` (name -> pid) used from each set-up's request to its 201, by kind (the
    mean over the rounds, seconds)."""
    times: dict[str, list[float]] = {k: [] for k in _KINDS}
    cpu: dict[str, dict[str, float]] = {k: dict.fromkeys(processes or {}, 0.0) for k in _KINDS}
    with httpx.Client(base_url=a.base, headers=a.headers, timeout=60) as client:
        for i in range(n + 1):  # the first round warms both paths up and is not counted
            for kind in (_KINDS if i % 2 == 0 else list(reversed(_KINDS))):
                before = {name: cpu_seconds(pid) for name, pid in (processes or {}).items()}
                took, tunnel = _one(client, kind)
                after = {name: cpu_seconds(pid) for name, pid in (processes or {}).items()}
                if tunnel is None:
                    raise RuntimeError(f"a {kind} set-up failed")
                if i:
                    times[kind].append(took)
                    for name in before:
                        cpu[kind][name] += (after[name] - before[name]) / n
                client.delete(f"/v1/tunnels/{tunnel}").raise_for_status()
    return times, cpu


def many(a: Site, lab: Any, count: int, concurrency: int) -> dict[str, tuple[int, int, list[float], float]]:
    """``count`` tunnels of each kind at ``concurrency``: (up, failed, set-up times, wall seconds) by kind."""
    left = lab.host("left")
    sources = [f"10.10.{i // 250}.{i % 250 + 1}" for i in range(count)]
    subprocess.run(["ip", "-n", left.netns, "-batch", "-"], check=True, timeout=120, text=True,
                   input="".join(f"addr add {s}/32 dev lo\n" for s in sources))
    # charon learns addresses from netlink events and loses some of a burst of this size:
    # restarted, it reads the whole list.
    lab.stop_charon("left")
    lab.start_charon("left")
    out: dict[str, tuple[int, int, list[float], float]] = {}
    with httpx.Client(base_url=a.base, headers=a.headers, timeout=120,
                      limits=httpx.Limits(max_connections=concurrency)) as client:
        for kind in _KINDS:
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda s: _one(client, kind, [f"{s}/32"]), sources))  # noqa: B023
            wall = time.monotonic() - started
            made = [t for _, t in results if t is not None]
            out[kind] = (len(made), len(results) - len(made), [took for took, t in results if t is not None], wall)
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(lambda t: client.delete(f"/v1/tunnels/{t}"), made))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--many", type=int, default=1000, help="tunnels of each kind brought up at once (0: none)")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 500 or not 0 <= args.many <= 5000 or not 1 <= args.concurrency <= 64:
        parser.error("--rounds 1..500, --many 0..5000, --concurrency 1..64")
    with _sites() as (a, b, lab):
        assert a.proc is not None
        assert b.proc is not None
        processes = {"site A": a.proc.pid, "site B": b.proc.pid,
                     **{f"charon {host}": pid for host, pid in sorted(lab.pids.items())}}
        times, cpu = rounds(a, args.rounds, processes)
        local, peered = statistics.median(times["local"]), statistics.median(times["peered"])
        print(f"set-up, median of {args.rounds} rounds taking turns: local {local * 1000:.1f} ms, "
              f"peered {peered * 1000:.1f} ms; peered / local = {peered / local:.2f} (goal <= 1.3)", flush=True)
        for kind, used in cpu.items():
            print(f"  CPU from request to 201, mean of {args.rounds} {kind} set-ups: "
                  + ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in used.items())
                  + f"; {sum(used.values()) * 1000:.1f} ms in all", flush=True)
        if args.many:
            for kind, (up, failed, took, wall) in many(a, lab, args.many, args.concurrency).items():
                print(f"{args.many} {kind} tunnels at {args.concurrency} clients: {up} up, {failed} failed; "
                      f"p50 {percentile(took, 50) * 1000:.1f} ms, p99 {percentile(took, 99) * 1000:.1f} ms; "
                      f"{wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
