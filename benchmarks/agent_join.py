"""Agent join time: ``connect`` -> tunnel up, against a bare VICI ``initiate`` of a prepared road warrior.

Three namespaces (tests/integration/agent/topology.py): Host and Target each a real
``qoss serve``, the client's charon in its own namespace. In one run:

* **agent**: the client (a Python process inside the client's namespace, the same code
  as ``qoss agent connect`` without the interpreter start-up) signs and seals a request,
  Host checks and endorses it over HTTP, Target negotiates and loads pool, key and conn
  into its charon, the client verifies the answer, loads its side, initiates and checks
  ``list-sas``; then it disconnects (not timed).
* **bare**: the same suite as a road-warrior conn prepared in both charons in advance;
  only ``initiate`` is timed, then ``terminate``.

Goal: median agent / median bare <= 3. Run as root: ``python -m benchmarks.agent_join``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from tests.integration.agent.topology import Topology

INNER = r"""
import json, sys, time
from app.adapters.agent.crypto import load_keys
from app.adapters.vici.driver import ViciGateway
from app.services.agent_client import AgentClient
from app.services.agent_config import load_client_config
cfg = load_client_config(__import__("pathlib").Path(sys.argv[1]))
client = AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), vici=ViciGateway(cfg.vici_socket, 20.0))
times, last = [], None
for i in range(int(sys.argv[2])):
    start = time.perf_counter()
    last = client.connect(target="target-1", objective_id=3)
    times.append((time.perf_counter() - start) * 1000)
    client.disconnect(last["ticket"])
print(json.dumps({"ms": times, "esp": last["esp_proposal"], "ike": last["ike_proposal"]}))
"""


def bare(topo: Topology, ike: str, esp: str, n: int) -> list[float]:
    from app.domain.agent import TunnelingInfo, client_conn, target_conn

    t, c = topo.target.gateway(10.0), topo.client.gateway(10.0)
    name, key = "bare-rw", b"k" * 32
    info = TunnelingInfo(ticket="0" * 32, protection="esp", target_address=topo.target.ike_address,
                         target_identity="bare.target", client_identity="bare.client",
                         remote_ts=(f"{topo.target.inside_address}/32",), ike_proposal=ike, esp_proposal=esp,
                         mode="tunnel", suite={}, notes=(), expires=0)
    t.load_pool(name, "10.8.0.14/32")
    for v in (t, c):
        v.load_shared(name, key, owners=["bare.target", "bare.client"])
    t.load_conn(name, target_conn(name=name, target_address=topo.target.ike_address, target_identity="bare.target",
                                  client_identity="bare.client", client_address=topo.client.ike_address,
                                  local_ts=[f"{topo.target.inside_address}/32"], pool=name, ike_proposal=ike,
                                  esp_proposal=esp, mode="tunnel", ike_lifetime=3600, child_lifetime=1200))
    c.load_conn(name, client_conn(name=name, info=info, client_address=topo.client.ike_address))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        c.initiate(child=name, ike=name, timeout_ms=10_000)
        times.append((time.perf_counter() - start) * 1000)
        c.terminate(ike=name, timeout_ms=5000, force=True)
        time.sleep(0.02)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=25, help="runs of each (>= 20)")
    args = parser.parse_args()
    n = max(1, min(args.n, 500))
    topo = Topology(server_env={"QOSS_AGENT_RATE": "1000", "QOSS_AGENT_BURST": "1000",
                                "QOSS_AGENT_USER_RATE": "1000", "QOSS_AGENT_USER_BURST": "1000"})
    try:
        topo.open()
        done = subprocess.run(["ip", "netns", "exec", topo.client.netns, sys.executable, "-c", INNER,
                               str(topo.dir / "client.yaml"), str(n)],
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise SystemExit(f"agent runs failed: {done.stderr[-3000:]}")
        agent = json.loads(done.stdout.strip().splitlines()[-1])
        base = bare(topo, agent["ike"], agent["esp"], n)
    finally:
        topo.close()
    a, b = statistics.median(agent["ms"]), statistics.median(base)
    print(f"suite: ike {agent['ike']}, esp {agent['esp']}; {n} runs each")
    print(f"agent connect -> tunnel up: median {a:.1f} ms, p90 {sorted(agent['ms'])[int(0.9 * n) - 1]:.1f} ms")
    print(f"bare VICI initiate:         median {b:.1f} ms, p90 {sorted(base)[int(0.9 * n) - 1]:.1f} ms")
    print(f"ratio {a / b:.2f} (goal <= 3) {'OK' if a / b <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
