"""Agent join time: ``connect`` -> tunnel up, against a bare VICI ``initiate`` of a prepared road warrior.

Three namespaces (``app.adapters.lab_agent``, as ``qoss lab up --agent`` builds them): Host and
Target each a real ``qoss serve``, the client's charon in its own namespace. In one run:

* **agent**: the client (a Python process inside the client's namespace, the same code
  as ``qoss agent connect`` without the interpreter start-up) signs and seals a request,
  Host checks and endorses it over HTTP, Target negotiates and loads pool, key and conn
  into its charon, the client verifies the answer, loads its side, initiates and checks
  ``list-sas``; then it disconnects (not timed).
* **bare**: the same suite as a road-warrior conn prepared in both charons in advance
  (the suite is learnt from one untimed connect first); only ``initiate`` is timed, then
  ``terminate``, by the same client process in the same rounds: every round is one agent
  connect (+ disconnect) and one bare initiate (+ terminate), so a slow or fast spell of
  this shared machine falls on both alike. The arms take turns going first (``--order
  agent-first`` keeps the agent first): what runs first after the pause between rounds
  pays for waking an idle machine, and the one after it runs on a warm one, so a fixed
  order favours one arm (the bare initiate, 8-13 % faster second than first, measured);
  the figures by order are printed.

Goal: median agent / median bare <= 3. Run as root: ``python -m benchmarks.agent_join``.

Where the time goes: the client's steps (median ms, from ``AgentClient.last_steps``), the
CPU each process spent per round (``/proc/<pid>/stat``: robust when
the machine is shared), and with ``--breakdown`` the same connects with Client, Host and
Target in ONE process (no HTTP, no uvicorn): each role's steps (median ms, from the
``qoss.agent.timing`` DEBUG log). Real minus in-process is what the HTTP hops cost.
``--combined``: one ``qoss serve`` plays Host and Target (``url: local``), one hop fewer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from app.adapters.lab_agent import AgentLab

INNER = r"""
import gc, json, os, sys, time
from pathlib import Path
from app.adapters.agent.crypto import load_keys
from app.adapters.vici.driver import ViciGateway
from app.services.agent_client import AgentClient
from app.services.agent_config import load_client_config
cfg = load_client_config(Path(sys.argv[1]))
n, breakdown, bare = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
steps = {}
connecting = [False]  # the breakdown keeps the roles' steps of connects only, not of disconnects
if breakdown:  # Client, Host and Target in this process: no HTTP between them
    import logging
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.services.agent_config import load_server_config
    from app.services.agent_host import HostAgent
    from app.services.agent_target import TargetAgent
    from app.services.ratings import TableCache

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
    d = Path(sys.argv[1]).parent
    def role(name):
        c = load_server_config(d / f"{name}.yaml")
        return c, load_keys(c.key_dir, c.id), make_session_factory(make_engine(f"sqlite:///{d}/{name}.db"))
    tc, tk, tf = role("target")
    target = TargetAgent(config=tc, keys=tk, session_factory=tf, vici=lambda p: ViciGateway(p, 20.0),
                         cache=TableCache(), default_table="standards-2026")
    if (d / "host.yaml").exists():
        hc, hk, hf = role("host")
        host = HostAgent(config=hc, keys=hk, session_factory=hf, post=lambda url, wire: target.handle(wire).answer)
    else:  # --combined: one process is Host and Target
        host = HostAgent(config=tc, keys=tk, session_factory=tf, local_target=target)
    post = lambda url, wire: host.handle(wire).answer
    client = AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), vici=ViciGateway(cfg.vici_socket, 20.0),
                         post=post)
else:
    client = AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), vici=ViciGateway(cfg.vici_socket, 20.0))
bare_vici = ViciGateway(cfg.vici_socket, 20.0)
gc.freeze()  # as qoss agent connect does once its client is made
times, cpu, bare_ms, last = [], [], [], None
alternate = sys.argv[5] == "alternate"


def agent_round():
    global last
    start, start_cpu = time.perf_counter(), time.process_time()
    connecting[0] = True
    last = client.connect(target="target-1", objective_id=3)
    connecting[0] = False
    times.append((time.perf_counter() - start) * 1000)
    cpu.append((time.process_time() - start_cpu) * 1000)
    steps.setdefault("client", []).append(client.last_steps)
    steps.setdefault("client cpu", []).append(client.last_steps_cpu)
    client.disconnect(last["ticket"])


def bare_round():  # the prepared road warrior: initiate alone timed
    start = time.perf_counter()
    bare_vici.initiate(child="bare-rw", ike="bare-rw", timeout_ms=10_000)
    bare_ms.append((time.perf_counter() - start) * 1000)
    bare_vici.terminate(ike="bare-rw", timeout_ms=5000, force=True)


firsts = []  # per round: whether the agent went first
for i in range(n):
    agent_first = not bare or not alternate or i % 2 == 0
    firsts.append(agent_first)
    if bare:
        for arm in (agent_round, bare_round) if agent_first else (bare_round, agent_round):
            arm()
    else:
        agent_round()
    time.sleep(0.02)
print(json.dumps({"firsts": firsts, "ms": times, "cpu": cpu, "bare_ms": bare_ms, "esp": last["esp_proposal"],
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


def _pids(lab: AgentLab) -> dict[str, int]:
    charons = lab.lab.pids
    servers = lab.server_pids()
    named = ({"host+target server": servers["target"]} if lab.combined
             else {"target server": servers["target"], "host server": servers["host"]})
    return {**named, "client charon": charons["client"], "target charon": charons["target"]}


def _run(lab: AgentLab, n: int, breakdown: bool, bare: bool = False, order: str = "alternate") -> dict[str, object]:
    done = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", INNER,
                           str(lab.client_config_path("alice")), str(n), "1" if breakdown else "0",
                           "1" if bare else "0", order],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"agent runs failed: {done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median_steps(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0]) if rows else []
    return " ".join(f"{k} {statistics.median(float(str(r[k])) for r in rows if k in r):.2f}" for k in keys)


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(0.9 * len(values)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=25, help="runs of each (>= 20)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also run Client, Host and Target in one process and show each role's steps")
    parser.add_argument("--combined", action="store_true",
                        help="one qoss serve plays Host and Target (url: local): one HTTP hop instead of two")
    parser.add_argument("--order", choices=["alternate", "agent-first"], default="alternate",
                        help="which arm goes first in a round: alternately (default) or always the agent")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the servers and the lab
    n = max(1, min(args.n, 500))
    server_env = {"QOSS_AGENT_RATE": "1000", "QOSS_AGENT_BURST": "1000", "QOSS_AGENT_USER_RATE": "1000",
                  "QOSS_AGENT_USER_BURST": "1000"}
    with AgentLab.temporary("qj", server_env=server_env, combined=args.combined) as lab:
        lab.enroll("alice", objectives=(3, 2))
        pids = _pids(lab)
        first = _run(lab, 1, breakdown=False)  # learns the suite Target negotiates (untimed)
        prepare_bare(lab, str(first["ike"]), str(first["esp"]))
        before = {k: _cpu_ms(p) for k, p in pids.items()}
        agent = _run(lab, n, breakdown=False, bare=True, order=args.order)
        cpu = {k: (_cpu_ms(p) - before[k]) / n for k, p in pids.items()}
        local = _run(lab, n, breakdown=True) if args.breakdown else None
    ms, base_ms = list(agent["ms"]), list(agent["bare_ms"])  # type: ignore[call-overload]
    a, b = statistics.median(ms), statistics.median(base_ms)
    layout = "Host and Target in one server" if args.combined else "Host and Target in two servers"
    print(f"suite: ike {agent['ike']}, esp {agent['esp']}; {n} runs each; {layout}")
    print(f"agent connect -> tunnel up: median {a:.1f} ms, p90 {_p90(ms):.1f} ms")
    print(f"bare VICI initiate:         median {b:.1f} ms, p90 {_p90(base_ms):.1f} ms (same rounds, interleaved)")
    print(f"ratio {a / b:.2f} (goal <= 3) {'OK' if a / b <= 3 else 'MISSED'}")
    firsts = [bool(f) for f in agent["firsts"]]  # type: ignore[attr-defined]
    if any(firsts) and not all(firsts):
        def med(values: list[float], agent_first: bool) -> float:
            return statistics.median(v for v, f in zip(values, firsts, strict=True) if f == agent_first)
        print(f"by order (median ms): agent first {med(ms, True):.1f}, second {med(ms, False):.1f}; "
              f"bare first {med(base_ms, False):.1f}, second {med(base_ms, True):.1f}")
    steps: dict[str, list[dict[str, object]]] = agent["steps"]  # type: ignore[assignment]
    print(f"client steps (median ms): {_median_steps(steps['client'])}")
    print(f"client steps (median CPU ms of its thread): {_median_steps(steps['client cpu'])}")
    print("CPU per round (ms): client process "
          f"{statistics.median(agent['cpu']):.1f} (connect only), "  # type: ignore[arg-type]
          + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
          + " (the servers: connect + disconnect; the charons: that and the bare initiate + terminate)")
    if local is not None:
        lm = statistics.median(local["ms"])  # type: ignore[arg-type]
        print(f"in one process (no HTTP): median {lm:.1f} ms; the HTTP hops cost {a - lm:.1f} ms")
        for who, rows in local["steps"].items():  # type: ignore[attr-defined]
            kind = "CPU ms of the thread" if who.endswith(" cpu") else "ms"
            print(f"  {who.removesuffix(' cpu')} steps (median {kind}): {_median_steps(rows)}")


if __name__ == "__main__":
    main()
