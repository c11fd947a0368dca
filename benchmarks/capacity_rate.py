"""Tunnels per second through qoss against charon's own initiate rate, at 1, 8 and 32 at a time.

    .venv/bin/python -m benchmarks.capacity_rate [--tunnels 128] [--concurrency 1,8,32] [--rounds 2] [--settle 2]

One lab (two charons with kernel-libipsec in network namespaces) and one real ``qoss serve``
(uvicorn, SQLite, the service's defaults but the per-token tunnel rate). Every tunnel protects
its own /32 on the left (10.10.x.y) to the right's inside address. Per concurrency C and round,
two arms, one after the other, the order alternating between rounds:

* **qoss**: ``POST /v1/tunnels`` for each of the N sources, C clients at a time (each its own
  kept-alive HTTP connection: by default C connections of a minimal HTTP/1.1 client on one event
  loop, ``--client httpx`` an httpx client in a thread each); each answer is a tunnel negotiated, loaded on both ends,
  initiated and verified on both ends (charon's reports, or ``list-sas``). Timed from the first request to the
  last answer; then every tunnel is deleted, C at a time (timed apart).
* **charon**: the same N conns (the suite qoss negotiated, one IKE and one ESP proposal, the
  same selectors, a PSK each) loaded on both ends over VICI with the ``vici`` package, C at a
  time (timed apart), then ``initiate``, C at a time, each worker its own VICI session: the
  initiate phase alone is charon's rate. Then terminated and unloaded.

The clients run in this process, on the same cores as qoss and the charons: their CPU in each
timed phase is printed as ``client`` beside the server's and the charons' (a thread per client
with httpx costs about ten times the minimal client's, and more so at 32 threads).

Prints, per concurrency, tunnels/s of each arm (all rounds pooled: tunnels / seconds), the
ratio qoss / charon's initiate alone and the ratio against charon's load + initiate (the goal:
at least :data:`GOAL_RATIO` at every concurrency; and qoss's CPU per tunnel at most
:data:`GOAL_CPU_MS` ms at :data:`GOAL_CPU_AT` clients), how busy the machine's cores were in each
arm's timed phase (``/proc/stat``: a share near 100 % means the machine, not a queue, set the
rate), and how busy qoss's SQLite write queue
was in the timed phase (from its ``/metrics``: the share of the time a write transaction was
open, per write how long it was open, per set-up how long it waited for the writer, at its lock
or in line for a write group, and how many set-ups shared a transaction, ``QOSS_WRITE_GROUPS``).
A 503 from qoss is retried after its Retry-After (counted); any other failure is counted and
printed. After each arm the run waits ``--settle`` seconds (default :data:`SETTLE`) for the
tunnel monitor's checks of that arm's set-ups and teardowns, so that they fall in no timed
phase. Bounded by the number of tunnels and by ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import secrets
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import vici

from app.domain.tunnels import TunnelEnd, conn_payload
from app.lab.hosts import LabHost
from benchmarks._harness import (
    LeanConnection,
    Service,
    ThreadClients,
    UpWatch,
    cpu_seconds,
    lab_and_service,
    lean_parallel,
    left_sources,
    machine_seconds,
    open_session,
)

#: The goals this benchmark checks: qoss's rate against charon's loads + initiate of the same
#: conns at every concurrency, and qoss's own CPU per tunnel at 8 clients.
GOAL_RATIO, GOAL_CPU_MS, GOAL_CPU_AT = 0.6, 3.0, 8

#: The lifetimes qoss loads by default (no rekey happens within a run).
IKE_LIFETIME, CHILD_LIFETIME = 14400, 3600
RETRIES = 5
#: Seconds between arms: the tunnel monitor checks each tunnel 1 s after its events.
SETTLE = 2.0


@dataclass
class Arm:
    """One arm's totals at one concurrency, over all rounds."""

    tunnels: int = 0
    seconds: float = 0.0
    extra_seconds: float = 0.0  # charon: the load phase; qoss: the delete phase
    retried: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds in the timed phase, by process
    busy: float = 0.0  # the machine's busy and idle CPU seconds (all cores) in the timed phase
    idle: float = 0.0
    # qoss: its SQLite writes in the timed phase (seconds one was open, seconds waited, how many)
    queue_held: float = 0.0
    queue_waited: float = 0.0
    queue_writes: int = 0
    groups: int = 0  # write groups (QOSS_WRITE_GROUPS) and the set-ups they held
    grouped: int = 0
    failures: list[str] = field(default_factory=list)

    def rate(self, with_extra: bool = False) -> float:
        seconds = self.seconds + (self.extra_seconds if with_extra else 0.0)
        return self.tunnels / seconds if seconds > 0 else 0.0


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    @property
    def over(self) -> bool:
        return time.monotonic() > self.deadline


def _parallel(concurrency: int, jobs: list[Callable[[], None]], budget: _Budget) -> tuple[float, list[str]]:
    """Run ``jobs`` ``concurrency`` at a time; seconds from the first start to the last end, and the errors."""
    errors: list[str] = []
    lock = threading.Lock()

    def run(job: Callable[[], None]) -> None:
        if budget.over:
            with lock:
                errors.append("time budget reached: not started")
            return
        try:
            job()
        except Exception as exc:  # counted and printed; the run goes on
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    with ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        list(pool.map(run, jobs))
        return time.perf_counter() - t0, errors


_QUEUE = ("qoss_sqlite_write_held_seconds_total", "qoss_sqlite_write_wait_seconds_total", "qoss_sqlite_writes_total",
          "qoss_sqlite_group_wait_seconds_total", "qoss_sqlite_write_groups_total", "qoss_sqlite_grouped_writes_total")


def _write_queue(clients: ThreadClients) -> tuple[float, ...]:
    """qoss's SQLite write queue so far, from ``/metrics``: seconds held, seconds waited, write
    transactions; seconds set-ups waited in line for a write group, the groups, the set-ups they held."""
    text = clients.get().get("/metrics").text
    totals = dict.fromkeys(_QUEUE, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return tuple(totals[name] for name in _QUEUE)


def _qoss_round(svc: Service, clients: ThreadClients, sources: list[str], right: LabHost, concurrency: int,
                budget: _Budget, arm: Arm, lean: bool) -> None:
    ids: list[str] = []
    retried = [0]
    lock = threading.Lock()

    def body(source: str) -> bytes:
        return json.dumps({"initiator": "left", "responder": "right", "local_ts": [f"{source}/32"],
                           "remote_ts": [f"{right.inside_address}/32"]}).encode()

    def created(status: int, headers: Mapping[str, str], content: bytes) -> bool:
        """Whether the answer is a tunnel made (its id kept); False for a 503 to retry (after its Retry-After).
        ``headers``: names in lower case, or a mapping that finds them in any case."""
        if status == 503 and "retry-after" in headers:
            with lock:
                retried[0] += 1
            return False
        if status != 201:
            raise RuntimeError(f"{status} {content[:200]!r}")
        with lock:
            ids.append(json.loads(content)["id"])
        return True

    def create(source: str) -> Callable[[], None]:
        def job() -> None:
            for _ in range(RETRIES):
                r = clients.get().post("/v1/tunnels", content=body(source),
                                       headers={"content-type": "application/json"})
                if created(r.status_code, r.headers, r.content):  # httpx's headers: any case
                    return
                time.sleep(min(1.0, float(r.headers["Retry-After"])))
            raise RuntimeError(f"503 {RETRIES} times")
        return job

    def create_lean(source: str) -> Callable[[LeanConnection], Awaitable[None]]:
        content = body(source)  # encoded before the clock starts, as the request's head is

        async def job(conn: LeanConnection) -> None:
            for _ in range(RETRIES):
                r = await conn.request("POST", "/v1/tunnels", content)
                if created(r.status, r.headers, r.body):
                    return
                await asyncio.sleep(min(1.0, float(r.headers["retry-after"])))
            raise RuntimeError(f"503 {RETRIES} times")
        return job

    def delete(tunnel_id: str) -> Callable[[], None]:
        return lambda: clients.get().delete(f"/v1/tunnels/{tunnel_id}").raise_for_status()

    queue_before = _write_queue(clients)
    if lean:
        jobs = [create_lean(s) for s in sources]
        with _cpu(arm, {"qoss": svc.pid, **svc.lab.pids}):
            seconds, errors = lean_parallel(svc, concurrency, jobs, budget.deadline)
    else:
        with _cpu(arm, {"qoss": svc.pid, **svc.lab.pids}):
            seconds, errors = _parallel(concurrency, [create(s) for s in sources], budget)
    queue_after = _write_queue(clients)
    arm.queue_held += queue_after[0] - queue_before[0]
    arm.queue_waited += queue_after[1] - queue_before[1]
    arm.queue_writes += int(queue_after[2] - queue_before[2])
    arm.queue_waited += queue_after[3] - queue_before[3]  # in line for a write group
    arm.groups += int(queue_after[4] - queue_before[4])
    arm.grouped += int(queue_after[5] - queue_before[5])
    arm.tunnels += len(ids)
    arm.seconds += seconds
    arm.retried += retried[0]
    arm.failures += errors
    seconds, errors = _parallel(concurrency, [delete(i) for i in ids], _Budget(600))
    arm.extra_seconds += seconds
    if errors:
        raise RuntimeError(f"qoss: {len(errors)} tunnels could not be deleted: {errors[0]}")


class _Sessions:
    """VICI sessions to both charons, one pair per worker thread, opened one after the other
    beforehand (never many connects at once)."""

    def __init__(self, sockets: dict[str, str], count: int) -> None:
        self._stack = contextlib.ExitStack()
        self._free: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._local = threading.local()
        try:
            for _ in range(count):
                self._free.put({n: open_session(path, self._stack) for n, path in sockets.items()})
        except BaseException:
            self._stack.close()
            raise

    def get(self, name: str) -> Any:
        held: dict[str, Any] | None = getattr(self._local, "sessions", None)
        if held is None:
            held = self._local.sessions = self._free.get(timeout=60)
        return held[name]

    def close(self) -> None:
        self._stack.close()


def _charon_round(left: LabHost, right: LabHost, pids: dict[str, int], sources: list[str],
                  proposals: dict[str, str], concurrency: int, budget: _Budget, arm: Arm, tag: str) -> None:
    """Load, initiate (C in flight), terminate and unload the same conns directly over VICI.

    ``initiate`` is sent without waiting (a negative timeout): a waiting ``initiate`` holds one
    of charon's 16 worker threads until the SA is up, and 16 or more at once leave none to
    process the IKE messages (every one of them then times out). Each worker waits instead for
    its conn's ``child-updown`` event, so C initiations are in flight at any time.
    """
    names = [f"cap{tag}-{i}" for i in range(len(sources))]
    ends = {name: (TunnelEnd(left.ike_address, f"{name}.left", (f"{source}/32",)),
                   TunnelEnd(right.ike_address, f"{name}.right", (f"{right.inside_address}/32",)))
            for name, source in zip(names, sources, strict=True)}
    loaded: list[str] = []
    up: list[str] = []
    lock = threading.Lock()

    def load(sessions: _Sessions, name: str) -> Callable[[], None]:
        def job() -> None:
            psk = secrets.token_bytes(32)
            local, remote = ends[name]
            for side, (a, b) in (("right", (remote, local)), ("left", (local, remote))):
                s = sessions.get(side)
                s.load_shared({"id": name, "type": "IKE", "data": psk, "owners": [a.identity, b.identity]})
                s.load_conn({name: conn_payload(
                    name=name, local=a, remote=b, ike_proposal=proposals["ike"], esp_proposal=proposals["esp"],
                    ah_proposal=None, mode="tunnel", ike_lifetime=IKE_LIFETIME, child_lifetime=CHILD_LIFETIME)})
            with lock:
                loaded.append(name)
        return job

    def initiate(sessions: _Sessions, watch: UpWatch, name: str) -> Callable[[], None]:
        def job() -> None:
            for _ in sessions.get("left").initiate({"child": name, "ike": name, "timeout": -1, "init-limits": "no"}):
                pass
            if not watch.wait(name, 30):
                raise RuntimeError(f"CHILD_SA {name} not up after 30 s")
            with lock:
                up.append(name)
        return job

    def remove(sessions: _Sessions, name: str) -> Callable[[], None]:
        def job() -> None:
            with contextlib.suppress(vici.exception.CommandException):
                for _ in sessions.get("left").terminate({"ike": name, "force": "yes", "timeout": 10000}):
                    pass
            for side in ("left", "right"):
                with contextlib.suppress(vici.exception.CommandException):
                    sessions.get(side).unload_conn({"name": name})
                with contextlib.suppress(vici.exception.CommandException):
                    sessions.get(side).unload_shared({"id": name})
        return job

    sockets = {"left": left.vici_socket, "right": right.vici_socket}
    watch = UpWatch(left.vici_socket)
    try:
        sessions = _Sessions(sockets, concurrency)
        try:
            seconds, errors = _parallel(concurrency, [load(sessions, n) for n in names], budget)
        finally:
            sessions.close()
        arm.extra_seconds += seconds
        arm.failures += [f"load: {e}" for e in errors]
        sessions = _Sessions(sockets, concurrency)
        try:
            with _cpu(arm, pids):
                seconds, errors = _parallel(concurrency, [initiate(sessions, watch, n) for n in loaded], budget)
        finally:
            sessions.close()
        arm.tunnels += len(up)
        arm.seconds += seconds
        arm.failures += [f"initiate: {e}" for e in errors]
    finally:
        watch.close()
        sessions = _Sessions(sockets, concurrency)
        try:
            _parallel(concurrency, [remove(sessions, n) for n in names], _Budget(600))
        finally:
            sessions.close()


@contextlib.contextmanager
def _cpu(arm: Arm, pids: dict[str, int]) -> Iterator[None]:
    """Adds the CPU seconds each process spends in the block to ``arm.cpu``, and this process's
    (the clients': HTTP to qoss, or VICI to charon) as ``client``; and the whole machine's busy
    and idle seconds to ``arm.busy`` and ``arm.idle``."""
    pids = {**pids, "client": os.getpid()}
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    machine = machine_seconds()
    yield
    busy, idle = machine_seconds()
    arm.busy += busy - machine[0]
    arm.idle += idle - machine[1]
    for k, p in pids.items():
        arm.cpu[k] = arm.cpu.get(k, 0.0) + cpu_seconds(p) - before[k]


@contextlib.contextmanager
def _terminated_on_signal() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still clean up
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--tunnels", type=int, default=128, help="tunnels per arm and round (default 128)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated (default 1,8,32)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per concurrency, arms alternating (default 2)")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds for the whole run (default 900)")
    parser.add_argument("--settle", type=float, default=SETTLE,
                        help=f"seconds waited after each arm for the monitor's checks (default {SETTLE:g})")
    parser.add_argument("--server-env", action="append", default=[], metavar="QOSS_X=VALUE",
                        help="a setting for the server (repeatable), e.g. QOSS_MAX_WRITES_IN_FLIGHT=1")
    parser.add_argument("--client", choices=("lean", "httpx"), default="lean",
                        help="the qoss arm's HTTP client: one event loop with a minimal HTTP/1.1 client "
                             "(default), or httpx in a thread per client")
    args = parser.parse_args()
    server_env = dict(item.split("=", 1) for item in args.server_env)
    levels = sorted({max(1, min(256, int(c))) for c in args.concurrency.split(",")})
    n = max(1, min(args.tunnels, 10_000))
    budget = _Budget(args.budget)
    with _terminated_on_signal(), lab_and_service(server_env) as svc:
        left, right = svc.lab.host("left"), svc.lab.host("right")
        sources = left_sources(svc, n)
        clients = ThreadClients(svc, timeout=60)
        try:
            warm = clients.get()
            proposals: dict[str, str] = {}
            for source in sources[:5]:  # warms the service up; learns the suite qoss negotiates
                r = warm.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                                   "local_ts": [f"{source}/32"],
                                                   "remote_ts": [f"{right.inside_address}/32"]})
                r.raise_for_status()
                proposals = r.json()["proposals"]
                warm.delete(f"/v1/tunnels/{r.json()['id']}").raise_for_status()
            results: dict[int, dict[str, Arm]] = {}
            for k, c in enumerate(levels):
                arms = results.setdefault(c, {"qoss": Arm(), "charon": Arm()})
                for r_ in range(args.rounds):
                    if budget.over:
                        print(f"time budget reached at concurrency {c}, round {r_ + 1}")
                        break
                    order = ["qoss", "charon"] if (k + r_) % 2 == 0 else ["charon", "qoss"]
                    for name in order:
                        if name == "qoss":
                            _qoss_round(svc, clients, sources, right, c, budget, arms["qoss"], args.client == "lean")
                        else:
                            _charon_round(left, right, svc.lab.pids, sources, proposals, c, budget,
                                          arms["charon"], f"{c}r{r_}")
                        time.sleep(max(0.0, args.settle))  # the monitor's checks after an arm's set-ups and teardowns
        finally:
            clients.close()
    _report(n, args.rounds, proposals, results, server_env, args.client)


def _report(n: int, rounds: int, proposals: dict[str, str], results: dict[int, dict[str, Arm]],
            server_env: dict[str, str], client: str) -> None:
    print(f"capacity_rate: {n} tunnels per arm and round, {rounds} rounds per concurrency, arms alternating, "
          f"qoss's client {client}; "
          f"suite ike {proposals.get('ike')}, esp {proposals.get('esp')}"
          + (f"; server settings {server_env}" if server_env else ""))
    print(f"{'clients':>7} | {'qoss tunnels/s':>14} | {'charon initiate/s':>17} | {'ratio':>5} | "
          f"{'charon load+init/s':>18} | {'ratio':>5} | failed qoss/charon | 503 retried")
    for c, arms in results.items():
        q, ch = arms["qoss"], arms["charon"]
        ratio = q.rate() / ch.rate() if ch.rate() else float("nan")
        ratio_full = q.rate() / ch.rate(with_extra=True) if ch.rate(with_extra=True) else float("nan")
        print(f"{c:>7} | {q.rate():>14.1f} | {ch.rate():>17.1f} | {ratio:>5.2f} | {ch.rate(with_extra=True):>18.1f} | "
              f"{ratio_full:>5.2f} | {len(q.failures):>8}/{len(ch.failures):<9} | {q.retried}")
    print("CPU per tunnel in the timed phase (ms): " + "; ".join(
        f"{c} clients: " + ", ".join(f"{name} arm " + " ".join(f"{k} {v / max(1, arm.tunnels) * 1000:.1f}"
                                                               for k, v in arm.cpu.items())
                                     for name, arm in arms.items())
        for c, arms in results.items()))
    cores = os.cpu_count() or 1
    print(f"the machine's {cores} cores busy in the timed phase (share of their time): " + "; ".join(
        f"{c} clients: " + ", ".join(f"{name} arm " + (f"{arm.busy / (arm.busy + arm.idle):.0%}"
                                                       if arm.busy + arm.idle > 0 else "n/a (too short)")
                                     for name, arm in arms.items())
        for c, arms in results.items()))
    print("qoss's SQLite writes in the timed phase (one at a time): " + "; ".join(
        f"{c} clients: open {q.queue_held / q.seconds:.0%} of the time, "
        f"{q.queue_held / max(1, q.queue_writes) * 1000:.1f} ms each, "
        f"set-ups waited {q.queue_waited / max(1, q.tunnels) * 1000:.1f} ms each "
        f"({q.queue_writes} writes for {q.tunnels} set-ups"
        + (f"; {q.grouped} of them in {q.groups} write groups)" if q.groups else ")")
        for c, q in ((c, arms["qoss"]) for c, arms in results.items()) if q.seconds > 0))
    for c, arms in results.items():
        for name, arm in arms.items():
            for line in arm.failures[:3]:
                print(f"  {name} at {c}: {line}")
    worst = min((a["qoss"].rate() / a["charon"].rate(with_extra=True) for a in results.values()
                 if a["charon"].rate(with_extra=True)), default=float("nan"))
    print(f"worst ratio qoss / charon load+init: {worst:.2f} (goal >= {GOAL_RATIO}) "
          f"{'OK' if worst >= GOAL_RATIO else 'MISSED'}")
    if GOAL_CPU_AT in results:
        q = results[GOAL_CPU_AT]["qoss"]
        cpu = q.cpu.get("qoss", float("nan")) / max(1, q.tunnels) * 1000
        print(f"qoss CPU per tunnel at {GOAL_CPU_AT} clients: {cpu:.1f} ms (goal <= {GOAL_CPU_MS}) "
              f"{'OK' if cpu <= GOAL_CPU_MS else 'MISSED'}")


if __name__ == "__main__":
    main()
