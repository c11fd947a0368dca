"""Agent join time: ``connect`` -> tunnel up, against a bare VICI ``initiate`` of a prepared road warrior.

Three namespaces (``app.lab.agent``, as ``qoss lab up --agent`` builds them): Host and
Target each a real ``qoss serve``, the client's charon in its own namespace. In one run:

* **agent**: the client (a Python process inside the client's namespace, the same code
  as ``qoss agent connect`` without the interpreter start-up) signs and seals a request,
  Host checks and endorses it over HTTP, Target negotiates and loads pool, key and conn
  into its charon, the client verifies the answer, loads its side and initiates without
  waiting in charon, and verifies charon's report of the SAs (with ``QOSS_DETACHED_INITIATE``
  or ``QOSS_SA_REPORTS`` false in the environment: charon waits, and ``list-sas`` is read);
  then it disconnects (not timed).
* **bare**: the same suite as a road-warrior conn prepared in both charons in advance
  (the suite is learnt from one untimed connect first); only ``initiate`` is timed (charon
  answering once the SAs are up, as ``swanctl --initiate`` waits: the goal's reference), then
  ``terminate``, by the same client process in the same rounds: every round is one agent
  connect (+ disconnect) and one bare initiate (+ terminate), so a slow or fast spell of
  this shared machine falls on both alike. The arms take turns going first (``--order
  agent-first`` keeps the agent first): what runs first after the pause between rounds
  pays for waking an idle machine, and the one after it runs on a warm one, so a fixed
  order favours one arm (the bare initiate, 8-13 % faster second than first, measured);
  the figures by order are printed.

Goal: median agent / median bare <= 2.5. Run as root: ``python -m benchmarks.agent_join``.

Where the time goes: the client's steps (median ms, from ``AgentClient.last_steps``), the
CPU each process spent per round (``/proc/<pid>/stat``: robust when
the machine is shared), and with ``--breakdown`` the same connects with Client, Host and
Target in ONE process (no HTTP, no uvicorn): each role's steps (median ms, from the
``qoss.agent.timing`` DEBUG log). Real minus in-process is what the HTTP hops cost.
``--combined``: one ``qoss serve`` plays Host and Target (``url: local``), one hop fewer.

``--fast-paths on|off`` sets ``QOSS_FAST_PATHS`` for the servers and the client;
``--fast-paths compare`` runs both: a second pair of servers with the fast paths off beside
the lab's own (same namespaces and charons, port + 1, databases, configs and a pool of their
own) and a second client, one connect of each per round, the order rotating; it prints each
arm's median and their ratio.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.lab.agent import MARK, AgentLab
from app.lab.agent_users import enroll

INNER = r"""
import gc, json, os, sys, time
from pathlib import Path
from app.adapters.agent.crypto import CRYPTO, load_keys
from app.adapters.vici.gateway import ViciGateway
from app.cli.agent import client_reports
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings
arms = json.loads(sys.argv[1])  # [{"config", "fast"}]: the first one's config is the breakdown's and bare's
cfg = load_client_config(Path(arms[0]["config"]))
n, breakdown, bare = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
steps = {}
connecting = [False]  # the breakdown keeps the roles' steps of connects only, not of disconnects
if breakdown:  # Client, Host and Target in this process: no HTTP between them
    import logging
    from app.adapters.agent.transport import post_message
    from app.adapters.db.agent_store import SqlAgentStore
    from app.adapters.db.engine import make_session_factory
    from app.adapters.db.unit_of_work import sql_units_of_work
    from app.bootstrap import engine_for
    from app.settings import Settings
    from app.services.agent.config import load_server_config
    from app.services.agent.host import HostAgent
    from app.services.agent.target import TargetAgent

    class Collect(logging.Handler):
        def emit(self, record):
            what, text = record.args
            if what != "client" and connecting[0]:
                pairs = [p.split("=") for p in text.split()]
                steps.setdefault(what, []).append({k: float(v.split("/")[0]) for k, v in pairs})
                steps.setdefault(what + " cpu", []).append({k: float(v.split("/")[1]) for k, v in pairs})

    log = logging.getLogger("qoss.agent.timing")
    log.setLevel(logging.DEBUG)
    log.addHandler(Collect())
    d = Path(arms[0]["config"]).parent
    def role(name):
        c = load_server_config(d / f"{name}.yaml")
        return c, load_keys(c.key_dir, c.id), make_session_factory(
            engine_for(Settings(database_url=f"sqlite:///{d}/{name}.db")))
    tc, tk, tf = role("target")
    target_store = SqlAgentStore(tf)
    target = TargetAgent(config=tc, keys=tk, crypto=CRYPTO, store=target_store, units=sql_units_of_work(tf),
                         vici=lambda p: ViciGateway(p, 20.0), default_table="standards-2026")
    if (d / "host.yaml").exists():
        hc, hk, hf = role("host")
        host = HostAgent(config=hc, keys=hk, crypto=CRYPTO, store=SqlAgentStore(hf),
                         post=lambda url, wire: target.handle(wire).answer)
    else:  # --combined: one process is Host and Target
        host = HostAgent(config=tc, keys=tk, crypto=CRYPTO, store=target_store, local_target=target, post=post_message)
    post = lambda url, wire: host.handle(wire).answer
    clients = [AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), crypto=CRYPTO,
                           vici=ViciGateway(cfg.vici_socket, 20.0), post=post,
                           reports=client_reports(Settings(fast_paths=True)))]
else:
    import functools
    from app.adapters.agent.transport import post_message

    def client_of(arm):  # each arm's client posts with its arm's QOSS_FAST_PATHS, as qoss agent connect would
        c = load_client_config(Path(arm["config"]))
        return AgentClient(config=c, keys=load_keys(c.key_dir, c.user), crypto=CRYPTO,
                           vici=ViciGateway(c.vici_socket, 20.0),
                           post=functools.partial(post_message, fast_paths=arm["fast"]),
                           reports=client_reports(Settings(fast_paths=arm["fast"])))
    clients = [client_of(arm) for arm in arms]
bare_vici = ViciGateway(cfg.vici_socket, 20.0)
gc.freeze()  # as qoss agent connect does once its client is made
times, cpu, bare_ms, last = [[] for _ in clients], [[] for _ in clients], [], None
alternate = sys.argv[5] == "alternate"


def agent_round(k):
    global last
    client = clients[k]
    start, start_cpu = time.perf_counter(), time.process_time()
    connecting[0] = True
    last = client.connect(target="target-1", objective_id=3)
    connecting[0] = False
    times[k].append((time.perf_counter() - start) * 1000)
    cpu[k].append((time.process_time() - start_cpu) * 1000)
    if k == 0:
        steps.setdefault("client", []).append(client.last_steps)
        steps.setdefault("client cpu", []).append(client.last_steps_cpu)
    client.disconnect(last["ticket"])


def bare_round():  # the prepared road warrior: initiate alone timed
    start = time.perf_counter()
    bare_vici.initiate(child="bare-rw", ike="bare-rw", timeout_ms=10_000)
    bare_ms.append((time.perf_counter() - start) * 1000)
    bare_vici.terminate(ike="bare-rw", timeout_ms=5000, force=True)


# Each round runs every arm once: the agent arms (one per configuration) and, with bare, the
# bare initiate. Alternately, the arms take turns going first (the order rotates by one each
# round); with agent-first, the agent arms rotate among themselves and the bare initiate goes last.
agent_arms = list(range(len(clients)))
if len(clients) > 1:  # untimed: each client's first connect builds what it keeps (connections, an httpx client)
    for k in agent_arms:
        agent_round(k)
    times, cpu = [[] for _ in clients], [[] for _ in clients]
    steps.clear()
orders = []  # per round: the arms in the order they ran ("bare" for the bare initiate)
for i in range(n):
    if bare and alternate:
        order = [*agent_arms, "bare"]
        order = order[i % len(order):] + order[:i % len(order)]
    else:
        order = agent_arms[i % len(agent_arms):] + agent_arms[:i % len(agent_arms)] + (["bare"] if bare else [])
    orders.append(order)
    for arm in order:
        bare_round() if arm == "bare" else agent_round(arm)
    time.sleep(0.02)
print(json.dumps({"orders": orders, "ms": times, "cpu": cpu, "bare_ms": bare_ms, "esp": last["esp_proposal"],
                  "ike": last["ike_proposal"], "steps": steps}))
"""


def prepare_bare(lab: AgentLab, ike: str, esp: str) -> None:
    """The bare road warrior ``bare-rw``: pool, key and conn in Target's charon, key and conn in the client's."""
    from app.domain.agent import TunnelingInfo, client_conn, target_conn

    target, client = lab.host("target"), lab.host("client")
    t, c = target.gateway(10.0), client.gateway(10.0)
    name, key = "bare-rw", b"k" * 32
    info = TunnelingInfo(ticket="0" * 32, protection="esp", target_address=target.ike_address,
                         target_identity="bare.target", client_identity="bare.client",
                         remote_ts=(f"{target.inside_address}/32",), ike_proposal=ike, esp_proposal=esp,
                         mode="tunnel", suite={}, notes=(), expires=0)
    t.load_pool(name, "10.8.0.14/32")
    for v in (t, c):
        v.load_shared(name, key, owners=["bare.target", "bare.client"])
    t.load_conn(name, target_conn(name=name, target_address=target.ike_address, target_identity="bare.target",
                                  client_identity="bare.client", client_address=client.ike_address,
                                  local_ts=[f"{target.inside_address}/32"], pool=name, ike_proposal=ike,
                                  esp_proposal=esp, mode="tunnel", ike_lifetime=3600, child_lifetime=1200))
    c.load_conn(name, client_conn(name=name, info=info, client_address=client.ike_address))


def _cpu_ms(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Arm:
    """One configuration of the servers and the client: QOSS_FAST_PATHS on or off."""

    name: str
    fast: bool
    config: str  # the client's config for this arm's Host
    pids: dict[str, int]  # this arm's servers, by what they play


def _server_pids(lab: AgentLab) -> dict[str, int]:
    servers = lab.server_pids()
    return ({"host+target server": servers["target"]} if lab.combined
            else {"target server": servers["target"], "host server": servers["host"]})


def _start_arm(lab: AgentLab, k: int, name: str, fast: bool, procs: list[subprocess.Popen[bytes]]) -> Arm:
    """Servers for arm ``k`` >= 1 beside the lab's own (arm 0): the same namespaces, charons and keys,
    port + k, databases and configs of their own (``ROLE-k``), a pool of their own; alice enrolled."""
    port, suffix = lab.port + k, f"-{k}"
    pool = f"{ipaddress.ip_network(lab.pool).network_address + 32 * k}/28"
    for role in lab.roles:
        config = yaml.safe_load(lab.config_path(role).read_text())
        if "target" in config:
            config["target"]["pool"] = pool
        if "host" in config and not lab.combined:
            config["host"]["targets"]["target-1"]["url"] = f"http://{lab.host('target').ike_address}:{port}"
        (lab.state_dir / f"{role}{suffix}.yaml").write_text(yaml.safe_dump(config))
    client = yaml.safe_load(lab.client_config_path("alice").read_text())
    front = lab.host(lab.host_server)
    client["host"]["url"] = f"http://{front.ike_address}:{port}"
    client["state_dir"] = str(lab.state_dir / f"client-alice{suffix}")
    config_path = lab.state_dir / f"client-alice{suffix}.yaml"
    config_path.write_text(yaml.safe_dump(client))
    front_db = f"sqlite:///{lab.state_dir}/{lab.host_server}{suffix}.db"
    pids = {}
    for role in lab.roles:
        db = f"sqlite:///{lab.state_dir}/{role}{suffix}.db"
        lab.qoss("db", "upgrade", "--database-url", db)
        if db == front_db:
            lab.qoss("agent", "enroll", str(lab.key_dir / "alice.pub.json"), "--objective", "3", "--objective", "2",
                     "--database-url", db)
        h = lab.host(role)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("QOSS_")},
               MARK: str(lab.state_dir),  # qoss lab down (and the lab's own down) stops it too
               "QOSS_DATABASE_URL": db, "QOSS_AGENT_CONFIG": str(lab.state_dir / f"{role}{suffix}.yaml"),
               "QOSS_RECONCILE_ON_START": "false", "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning",
               "QOSS_VICI_SOCKET_DIRS": json.dumps([str(lab.state_dir)]), **lab.server_env,
               "QOSS_FAST_PATHS": "true" if fast else "false"}
        with open(lab.state_dir / f"{role}{suffix}.log", "ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.cli", "serve", "--host", h.ike_address,
                 "--port", str(port)], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=lab.state_dir)
        procs.append(proc)
        pids[("host+target" if lab.combined else role) + f" server {k}"] = proc.pid
    for role in lab.roles:
        _wait(lab, f"http://{lab.host(role).ike_address}:{port}/healthz")
    return Arm(name, fast, str(config_path), pids)


def _wait(lab: AgentLab, url: str, timeout: float = 60.0) -> None:
    probe = "import urllib.request,sys; sys.exit(urllib.request.urlopen(sys.argv[1], timeout=1).status != 200)"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", probe, url],
                              capture_output=True, timeout=30, check=False)
        if done.returncode == 0:
            return
        time.sleep(0.3)
    raise RuntimeError(f"server at {url} did not come up: see {lab.state_dir}")


def _run(lab: AgentLab, arms: list[Arm], n: int, breakdown: bool, bare: bool = False,
         order: str = "alternate") -> dict[str, Any]:
    spec = json.dumps([{"config": a.config, "fast": a.fast} for a in arms])
    done = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", INNER, spec,
                           str(n), "1" if breakdown else "0", "1" if bare else "0", order],
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        logs = "".join(f"\n--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                       for log in sorted(lab.state_dir.glob("*.log")))
        raise SystemExit(f"agent runs failed: {done.stderr[-3000:]}{logs}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median_steps(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0]) if rows else []
    return " ".join(f"{k} {statistics.median(float(str(r[k])) for r in rows if k in r):.2f}" for k in keys)


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(0.9 * len(values)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=25, help="rounds (>= 20)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also run Client, Host and Target in one process and show each role's steps")
    parser.add_argument("--combined", action="store_true",
                        help="one qoss serve plays Host and Target (url: local): one HTTP hop instead of two")
    parser.add_argument("--order", choices=["alternate", "agent-first"], default="alternate",
                        help="which arm goes first in a round: each in turn (default) or always an agent arm")
    parser.add_argument("--fast-paths", choices=["on", "off", "compare"], default="on",
                        help="QOSS_FAST_PATHS of the servers and the client: on (default), off, or compare: both, "
                             "each with servers of its own, one connect of each per round")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the servers and the lab
    n = max(1, min(args.n, 500))
    first_fast = args.fast_paths != "off"
    server_env = {"QOSS_AGENT_RATE": "1000", "QOSS_AGENT_BURST": "1000", "QOSS_AGENT_USER_RATE": "1000",
                  "QOSS_AGENT_USER_BURST": "1000"}
    procs: list[subprocess.Popen[bytes]] = []
    with AgentLab.temporary("qj", server_env={**server_env, "QOSS_FAST_PATHS": str(first_fast).lower()},
                            combined=args.combined) as lab:
        try:
            enroll(lab, "alice", objectives=(3, 2))
            arms = [Arm("fast paths on" if first_fast else "fast paths off", first_fast,
                        str(lab.client_config_path("alice")), _server_pids(lab))]
            if args.fast_paths == "compare":
                arms.append(_start_arm(lab, 1, "fast paths off", False, procs))
            charons = lab.lab.pids
            pids = {**{k: v for a in arms for k, v in a.pids.items()}, "client charon": charons["client"],
                    "target charon": charons["target"]}
            for arm in arms:
                first = _run(lab, [arm], 1, breakdown=False)  # warms each arm up; learns the suite (untimed)
            prepare_bare(lab, str(first["ike"]), str(first["esp"]))
            before = {k: _cpu_ms(p) for k, p in pids.items()}
            agent = _run(lab, arms, n, breakdown=False, bare=True, order=args.order)
            cpu = {k: (_cpu_ms(p) - before[k]) / n for k, p in pids.items()}
            local = _run(lab, arms[:1], n, breakdown=True) if args.breakdown else None
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    _report(args, arms, n, agent, cpu, local)


def _report(args: argparse.Namespace, arms: list[Arm], n: int, agent: dict[str, Any], cpu: dict[str, float],
            local: dict[str, Any] | None) -> None:
    ms: list[list[float]] = agent["ms"]
    base_ms: list[float] = agent["bare_ms"]
    b = statistics.median(base_ms)
    layout = "Host and Target in one server" if args.combined else "Host and Target in two servers"
    print(f"suite: ike {agent['ike']}, esp {agent['esp']}; {n} rounds; {layout}")
    width = max(len(a.name) for a in arms) + 2
    for arm, values in zip(arms, ms, strict=True):
        a = statistics.median(values)
        print(f"{arm.name + ':':<{width}} connect -> tunnel up median {a:.1f} ms, p90 {_p90(values):.1f} ms, "
              f"ratio to bare {a / b:.2f} (goal <= 2.5) {'OK' if a / b <= 2.5 else 'MISSED'}")
    print(f"{'bare:':<{width}} VICI initiate median {b:.1f} ms, p90 {_p90(base_ms):.1f} ms (same rounds)")
    for k in range(1, len(arms)):
        diffs = [x - y for x, y in zip(ms[k], ms[0], strict=True)]
        m0, mk = statistics.median(ms[0]), statistics.median(ms[k])
        print(f"{arms[k].name} vs {arms[0].name}: medians {mk:.2f} vs {m0:.2f} ms, ratio {mk / m0:.3f}; "
              f"per round, median difference {statistics.median(diffs):+.2f} ms "
              f"({statistics.median(diffs) / m0 * 100:+.1f} % of {arms[0].name})")
    orders: list[list[int | str]] = agent["orders"]
    keys: list[int | str] = [*range(len(arms)), "bare"]
    names = [a.name for a in arms] + ["bare"]
    by_position = []
    for key, name, values in zip(keys, names, [*ms, base_ms], strict=True):
        at: dict[int, list[float]] = {}
        for round_order, value in zip(orders, values, strict=True):
            at.setdefault(round_order.index(key), []).append(value)
        if len(at) > 1:
            by_position.append(f"{name} " + "/".join(f"{statistics.median(at[p]):.1f}" for p in sorted(at)))
    if by_position:
        print(f"by position in the round (median ms, 1st/2nd/...): {'; '.join(by_position)}")
    steps: dict[str, list[dict[str, object]]] = agent["steps"]
    print(f"client steps of {arms[0].name} (median ms): {_median_steps(steps['client'])}")
    print(f"client steps of {arms[0].name} (median CPU ms of its thread): {_median_steps(steps['client cpu'])}")
    print("CPU per round (ms): client process "
          + ", ".join(f"{a.name} {statistics.median(c):.1f}" for a, c in zip(arms, agent["cpu"], strict=True))
          + " (connect only), " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
          + " (the servers: connect + disconnect; the charons: that and the bare initiate + terminate)")
    if local is not None:
        lm = statistics.median(local["ms"][0])
        print(f"in one process (no HTTP): median {lm:.1f} ms; the HTTP hops cost "
              f"{statistics.median(ms[0]) - lm:.1f} ms")
        for who, rows in local["steps"].items():
            kind = "CPU ms of the thread" if who.endswith(" cpu") else "ms"
            print(f"  {who.removesuffix(' cpu')} steps (median {kind}): {_median_steps(rows)}")


if __name__ == "__main__":
    main()
