"""On the wire between real processes: in the agent lab (Host and Target each their own ``qoss
serve``, keys from ``qoss agent keygen``, configs naming the public key files), alice's connect
and disconnect go to Host sealed hybrid and come back hybrid; with Host's ML-KEM-768 key taken out
of her config (as the browser's page seals: X25519 alone), Host's answers come back X25519 alone,
and the tunnel still comes up. What Host sends Target is hybrid in both (the recorded run in
``tests/unit/services/test_hybrid_recorded.py`` opens it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from app.adapters.agent.crypto import load_keys, load_public
from app.lab.agent import HOST_ID, TARGET_ID, AgentLab
from app.lab.agent_configs import write_config
from app.lab.agent_users import enroll
from tests.fixtures.agent_roles import register_keys
from tests.fixtures.secrets import keep_log

pytestmark = pytest.mark.charon

#: Run as alice in the client's namespace: connect, disconnect, and say how each message and its
#: answer were sealed (true: hybrid).
SCRIPT = """
import json, sys
from pathlib import Path
from app.adapters.agent.crypto import CRYPTO, load_keys
from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import agent_post
from app.domain.agent import sealed_hybrid
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings

cfg = load_client_config(Path(sys.argv[1]))
post, seen = agent_post(Settings()), []

def spy(url, wire):
    answer = post(url, wire)
    seen.append([sealed_hybrid(wire), sealed_hybrid(answer)])
    return answer

client = AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), crypto=CRYPTO,
                     vici=ViciGateway(cfg.vici_socket, 20.0), post=spy)
report = client.connect(target=sys.argv[2], objective_id=3)
closed = client.disconnect(report["ticket"])
print(json.dumps({"seen": seen, "protection": report["protection"], "closed": closed}))
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[AgentLab]:
    with AgentLab.temporary("qh") as lab:
        try:
            enroll(lab, "alice", objectives=(3,))
            for name in (HOST_ID, TARGET_ID, "alice"):
                register_keys(load_keys(lab.key_dir, name))
            yield lab
        finally:
            for role in lab.roles:
                log = lab.state_dir / f"{role}.log"
                if log.exists():
                    keep_log(log, f"agent-hybrid-{log.name}")


def run_as_alice(lab: AgentLab, config: Path) -> dict[str, object]:
    done = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", SCRIPT,
                           str(config), TARGET_ID], capture_output=True, text=True, timeout=120, check=False,
                          env=lab.env(lab.client_env), cwd=lab.state_dir, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_connect_and_a_disconnect_are_sealed_hybrid_both_ways(lab: AgentLab) -> None:
    assert load_public(lab.public_key_file(HOST_ID))[1].mlkem is not None
    result = run_as_alice(lab, lab.client_config_path("alice"))
    assert result["protection"] == "esp"
    assert result["seen"] == [[True, True], [True, True]]  # connect, disconnect: request and answer


def test_a_client_sealing_to_host_with_x25519_alone_is_answered_so(lab: AgentLab) -> None:
    config = yaml.safe_load(lab.client_config_path("alice").read_text())
    public = load_public(Path(config["host"].pop("public_key_file")))[1].as_dict()
    config["host"].update(sign_public_key=public["sign_public_key"], kem_public_key=public["kem_public_key"])
    classic = lab.state_dir / "client-alice-x25519.yaml"
    write_config(classic, config, client=True)
    result = run_as_alice(lab, classic)
    assert result["protection"] == "esp"
    assert result["seen"] == [[False, False], [False, False]]
