"""A burst of agent joins: every join answered (a virtual IP and an SA, or a refusal counted), join times, joins/s.

    .venv/bin/python -m benchmarks.capacity_agent [--joins 1000] [--concurrency 8] [--budget 900]

Three namespaces as ``qoss lab up --agent`` builds them (``app.lab.agent``): Host and
Target each a real ``qoss serve`` (uvicorn, SQLite, the fast paths on), the client's charon in
its own namespace. N users are enrolled at Host (a key pair and a client config each); then one
Python process in the client's namespace (the same code as ``qoss agent connect``, without an
interpreter start per join) has every user join once, ``--concurrency`` at a time: sign and seal
the request, Host checks and endorses it, Target negotiates, leases a virtual IP and loads pool,
key and conn into its charon, the client loads its side, initiates without waiting in charon
and verifies charon's report of the SAs (as ``qoss agent connect`` does by default; the
process's clients share one event connection to their charon).

Each join ends one of three ways, all counted: **joined** (a virtual IP, the SA verified by the
client), **refused** (Host or Target answered with a refusal: its status and reason are
tallied), **failed** (an error on the way: its kind is tallied). After the burst both charons
are asked how many of the users' SAs they hold, and Target's database how many sessions and
leases it has: a join is **lost** if it is neither joined nor refused nor failed, or if the
charons or Target disagree with the joins reported. Then every user disconnects (same
concurrency) and the same counts must be zero.

Every lab user joins through the client namespace's one charon (a real user has a charon of
their own). An ``initiate`` that waits (``QOSS_DETACHED_INITIATE=false`` in the environment)
holds one of that charon's 16 worker threads until its SA is up: with 16 or more joins at once
it has none left for the IKE messages and the joins time out (measured: 32 at a time made a few
hundred joins fail or crawl). So at most 12 at once.

Target's pool is a /22 (1,022 virtual IPs); the per-address agent rate limit is raised, since
every lab user arrives from the client namespace's one address (real users come from their own).
Prints join time p50/p99 (each join's wall time in its worker, queueing at the servers included)
and joins/s (joined / the burst's wall time). Bounded by ``--joins`` and ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from app.lab.agent import HOST_ID, TARGET_ID, AgentLab
from app.lab.agent_configs import client_config, write_config
from benchmarks._harness import cpu_seconds, percentile, rss_kib

POOL = "10.8.0.0/22"
#: Below the client charon's 16 worker threads (see above).
MAX_CONCURRENCY = 12

#: Runs in the client's namespace: argv = [configs JSON file, concurrency, budget seconds].
INNER = r"""
import json, re, sys, threading, time, functools
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from app.adapters.agent.crypto import CRYPTO, load_keys
from app.adapters.agent.transport import RemoteRefused, post_message
from app.adapters.vici.gateway import ViciGateway
from app.cli.agent import client_reports
from app.domain.agent.codec import AgentRejected
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings

paths = json.loads(Path(sys.argv[1]).read_text())
concurrency, budget = int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + budget
client_socket, target_socket = sys.argv[4], sys.argv[5]
post = functools.partial(post_message, fast_paths=True)
reports = client_reports(Settings(fast_paths=True))  # one listener on the one client charon, as in one process
lock = threading.Lock()
outcomes, times, refusals, failures, joined, examples = Counter(), [], Counter(), Counter(), {}, []


def make(path):
    cfg = load_client_config(Path(path))
    return AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), crypto=CRYPTO,
                       vici=ViciGateway(cfg.vici_socket, 30.0), post=post, reports=reports)


def join(path):
    if time.monotonic() > deadline:
        with lock:
            outcomes["not started (budget)"] += 1
        return
    start = time.perf_counter()
    try:
        client = make(path)
        start = time.perf_counter()  # from here: reading the user's config and keys is not timed
        report = client.connect(target="target-1", objective_id=3)
    except AgentRejected as exc:
        kind, reason = "refused", f"AgentRejected: {exc}"
    except RemoteRefused as exc:
        detail = exc.remote_detail
        error = detail.get("error") if isinstance(detail, dict) else None
        kind, reason = "refused", f"{exc.status} {error or str(detail)[:80]}"
    except Exception as exc:  # QossError and anything else: tallied by kind and message, conn names blanked
        text = re.sub(r"qoss-agent-[0-9a-f]+", "qoss-agent-*", str(exc).split(" [charon log:")[0])
        kind, reason = "failed", f"{type(exc).__name__}: {text[:160]}"
        with lock:
            examples.append(str(exc)[:2000])
    else:
        ok = report.get("virtual_ip") is not None and report.get("conn") is not None
        kind, reason = ("joined", None) if ok else ("failed", f"no tunnel granted: {report.get('protection')}")
    elapsed = (time.perf_counter() - start) * 1000
    with lock:
        outcomes[kind] += 1
        if kind == "joined":
            times.append(elapsed)
            joined[path] = (client, report)
        elif kind == "refused":
            refusals[reason] += 1
        else:
            failures[reason] += 1


def count_sas(socket_path):
    sas = ViciGateway(socket_path, 60.0).list_sas()
    return sum(1 for sa in sas if sa.name.startswith("qoss-agent-") and sa.state == "ESTABLISHED" and sa.children)


t0 = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    list(pool.map(join, paths))
wall = time.perf_counter() - t0
vips = [r["virtual_ip"] for _, r in joined.values()]
after_join = {"client_sas": count_sas(client_socket), "target_sas": count_sas(target_socket)}
print(json.dumps({"phase": "joined", **after_join}), flush=True)
sys.stdin.readline()  # the outer process counts Target's sessions, then lets us go on
dis_failures = Counter()


def leave(item):
    client, report = item
    try:
        client.disconnect(report["ticket"])
    except Exception as exc:
        with lock:
            dis_failures[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1


t1 = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    list(pool.map(leave, list(joined.values())))
leave_wall = time.perf_counter() - t1
print(json.dumps({"phase": "done", "outcomes": outcomes, "ms": times, "wall": wall, "refusals": refusals,
                  "failures": failures, "examples": examples[:2], "distinct_vips": len(set(vips)), **after_join,
                  "leave_wall": leave_wall, "leave_failures": dis_failures,
                  "client_sas_after": count_sas(client_socket), "target_sas_after": count_sas(target_socket)}),
      flush=True)
"""


def _enroll(lab: AgentLab, users: list[str]) -> list[str]:
    """Key pair and client config for each user, all enrolled at Host in one transaction; the config paths."""
    from app.adapters.agent.crypto import KeyPair, load_public, write_keys
    from app.adapters.db.agent import UserRepository
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for
    from app.domain.agent import EnrolledUser
    from app.settings import Settings

    client = lab.host("client")
    paths, enrolled = [], []
    for user in users:
        write_keys(KeyPair.generate(user), lab.key_dir)
        path = lab.client_config_path(user)
        write_config(path, client_config(
            user=user, key_dir=lab.key_dir, host_id=HOST_ID, host_url=lab.url("host"),
            host_key=lab.key_dir / f"{HOST_ID}.pub.json", targets={TARGET_ID: lab.key_dir / f"{TARGET_ID}.pub.json"},
            vici_socket=client.vici_socket, state_dir=lab.state_dir / f"client-{user}",
            ike_address=client.ike_address), client=True)
        _, keys = load_public(lab.key_dir / f"{user}.pub.json")
        enrolled.append(EnrolledUser(user_id=user, sign_public_key=keys.sign, kem_public_key=keys.kem,
                                     objectives=frozenset({3})))
        paths.append(str(path))
    engine = engine_for(Settings(database_url=lab.database_url("host")))
    try:
        with make_session_factory(engine)() as session, session.begin():
            repo = UserRepository(session)
            for user in enrolled:
                repo.enroll(user)
    finally:
        engine.dispose()
    return paths


def _target_counts(lab: AgentLab) -> dict[str, int]:
    """Target's active sessions and leased virtual IPs, read from its database."""
    import sqlite3

    db = sqlite3.connect(f"file:{lab.state_dir / 'target.db'}?mode=ro", uri=True, timeout=30)
    try:
        active = db.execute("SELECT count(*) FROM agent_sessions WHERE state = 'active'").fetchone()[0]
        leases = db.execute("SELECT count(*) FROM agent_leases").fetchone()[0]
        return {"active sessions": int(active), "leases": int(leases)}
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--joins", type=int, default=1000, help="users, each joining once (default 1000, max 1000)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="joins at once (default 8, at most 12: the users share one client charon)")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds for the burst (default 900)")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR",
                        help="copy the charons' and servers' logs here before the lab is taken down")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the servers and the lab
    n = max(1, min(args.joins, 1000))
    c = max(1, min(args.concurrency, MAX_CONCURRENCY))
    server_env = {"QOSS_AGENT_RATE": "100000", "QOSS_AGENT_BURST": "100000"}
    with AgentLab.temporary("qc", server_env=server_env, pool=POOL) as lab:
        t0 = time.perf_counter()
        paths = _enroll(lab, [f"user{i:04d}" for i in range(n)])
        print(f"{n} users enrolled in {time.perf_counter() - t0:.1f} s", flush=True)
        configs = lab.state_dir / "burst.json"
        configs.write_text(json.dumps(paths))
        pids = {**{f"{role} server": pid for role, pid in lab.server_pids().items()},
                **{f"{name} charon": pid for name, pid in lab.lab.pids.items() if name != "host"}}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        runner = subprocess.Popen(
            ["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", INNER, str(configs), str(c),
             str(args.budget), lab.host("client").vici_socket, lab.host("target").vici_socket],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert runner.stdout is not None
            assert runner.stdin is not None
            first = runner.stdout.readline()
            if not first:
                raise SystemExit(f"the joins failed: {runner.communicate(timeout=60)[1][-3000:]}")
            cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
            rss = {k: rss_kib(p) for k, p in pids.items()}
            held = _target_counts(lab)
            runner.stdin.write("\n")
            runner.stdin.flush()
            out, err = runner.communicate(timeout=args.budget + 600)
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
        if runner.returncode != 0:
            raise SystemExit(f"the runner failed: {err[-3000:]}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        held_after = _target_counts(lab)
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for name in ("client", "target"):
                shutil.copy(lab.host(name).log_path, args.keep_logs / f"{name}-charon.log")
            for role in lab.roles:
                shutil.copy(lab.state_dir / f"{role}.log", args.keep_logs / f"{role}-server.log")
    _report(n, c, result, held, held_after, cpu, rss)


def _report(n: int, c: int, r: dict[str, Any], held: dict[str, int], held_after: dict[str, int],
            cpu: dict[str, float], rss: dict[str, int]) -> None:
    outcomes = Counter(r["outcomes"])
    joined, refused, failed = outcomes["joined"], outcomes["refused"], outcomes["failed"]
    not_started = outcomes["not started (budget)"]
    answered = joined + refused + failed
    counts = {"client SAs": r["client_sas"], "target SAs": r["target_sas"], "distinct virtual IPs": r["distinct_vips"],
              "Target active sessions": held["active sessions"], "Target leases": held["leases"]}
    mismatch = [f"{k} {v}" for k, v in counts.items() if v != joined]
    lost = n - not_started - answered
    ms: list[float] = r["ms"]
    print(f"\ncapacity_agent: {n} users join once each, {c} at a time; Host and Target each a qoss serve (SQLite)")
    print(f"  joined {joined}, refused {refused}, failed {failed}, lost {lost}"
          + (f", not started (time budget) {not_started}" if not_started else "")
          + f"; charons and Target agree: {'yes' if not mismatch else 'NO: ' + ', '.join(mismatch)}"
          + f" (SAs client {r['client_sas']}, target {r['target_sas']}; Target {held})")
    for reason, count in Counter(r["refusals"]).most_common(5):
        print(f"    refused {count}: {reason}")
    for reason, count in Counter(r["failures"]).most_common(5):
        print(f"    failed {count}: {reason}")
    for example in r["examples"][:1]:
        print(f"    the first failure in full: {example}")
    if ms:
        print(f"  join time: p50 {statistics.median(ms):.1f} ms, p99 {percentile(ms, 99):.1f} ms, "
              f"max {max(ms):.1f} ms; {joined / r['wall']:.1f} joins/s ({joined} in {r['wall']:.1f} s)")
    print("  CPU in the burst (s): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
          + "; RSS after it (MiB): " + ", ".join(f"{k} {v / 1024:.0f}" for k, v in rss.items()))
    print(f"  all left in {r['leave_wall']:.1f} s; {sum(Counter(r['leave_failures']).values())} disconnects failed; "
          f"after: SAs client {r['client_sas_after']}, target {r['target_sas_after']}; Target {held_after}")
    for reason, count in Counter(r["leave_failures"]).most_common(3):
        print(f"    disconnect failed {count}: {reason}")
    ok = lost == 0 and not mismatch
    print(f"  none lost: {'OK' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
