"""The tunnel agent against real charons: Host and Target in one real uvicorn on loopback.

The lab's ``left`` charon is the client's, ``right`` is Target's. The client service
talks HTTP to the server on 127.0.0.1 (``[::1]`` with :func:`running_agent`'s ``host``) and
VICI to its charon's socket; tunnels run between the namespaces, over the family the lab's
IKE runs over. Everything is torn down after the module, also on failure.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from app.adapters.agent.crypto import CRYPTO, KeyPair, load_keys, write_keys
from app.adapters.agent.transport import post_message
from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import prepare_database
from app.lab import agent_configs as lab_agent_configs
from app.lab.agent_configs import client_config, host_role, target_role, write_config
from app.lab.hosts import Lab
from app.main import create_app
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import register_keys
from tests.fixtures.secrets import register
from tests.integration.charon.conftest import temporary_lab

POOL = "10.3.0.0/28"


class RegisteringVici(ViciGateway):
    """The real driver; every secret loaded into a charon joins the suite-wide leak sweep."""

    def load_shared(self, id: str, secret: bytes | str, owners: Any, type: str = "IKE") -> None:
        register(secret)
        super().load_shared(id, secret, owners, type)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class AgentEnv:
    lab: Lab
    dir: Path
    url: str
    admin: dict[str, str]
    settings: Settings
    server: uvicorn.Server

    @property
    def target_vici(self) -> ViciGateway:
        return self.lab.host("right").gateway(timeout=5.0)

    @property
    def client_vici(self) -> ViciGateway:
        return self.lab.host("left").gateway(timeout=5.0)

    def keygen(self, name: str) -> KeyPair:
        keys = KeyPair.generate(name)
        register_keys(keys)
        write_keys(keys, self.dir / "keys", overwrite=True)
        return keys

    def enroll(self, user: str, objectives: list[int], keys: KeyPair | None = None) -> KeyPair:
        keys = keys or self.keygen(user)
        r = httpx.post(f"{self.url}/v1/agent/users", headers=self.admin, timeout=10, json={
            "user_id": user, "objectives": objectives, **keys.public.as_dict()})
        assert r.status_code == 201, r.text
        return keys

    def client(self, user: str) -> AgentClient:
        left, pub = self.lab.host("left"), self.dir / "keys" / "hq.pub.json"
        path = write_config(self.dir / f"client-{user}.yaml", client_config(
            user=user, key_dir=self.dir / "keys", host_id="hq", host_url=self.url, host_key=pub,
            targets={"hq": pub}, vici_socket=left.vici_socket, state_dir=self.dir / f"state-{user}",
            ike_address=left.gateway_ike_address), client=True)
        config = load_client_config(path)
        return AgentClient(config=config, keys=load_keys(config.key_dir, user),
                           crypto=CRYPTO, vici=RegisteringVici(config.vici_socket, timeout=20.0),
                           post=post_message)

    def audit(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/audit", headers=self.admin, params={"limit": 1000}, timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        return list(body["items"] if isinstance(body, dict) else body)

    def target_config_empty(self) -> bool:
        v = self.target_vici
        return (not [c for c in v.list_conns() if c.startswith("qoss-agent-")]
                and not [s for s in v.get_shared() if s.startswith("qoss-agent-")]
                and not [p for p in v.get_pools() if p.name.startswith("qoss-agent-")])


def server_config(dir: Path, lab: Lab, *, protected: list[str] | None = None, pool: str = POOL,
                  pool6: str | None = None) -> Path:
    """One server playing Host and Target (``url: local``) with the lab's ``right`` charon, on its
    IKE address of the lab's first family; by default protecting ``right``'s IPv4 inside address.
    Makes the server's keys (``hq``)."""
    keys = KeyPair.generate("hq")
    register_keys(keys)
    write_keys(keys, dir / "keys")
    right, pub = lab.host("right"), dir / "keys" / "hq.pub.json"
    return write_config(dir / "agent.yaml", lab_agent_configs.server_config(
        id="hq", key_dir=dir / "keys", host=host_role({"hq": ("local", pub)}),
        target=target_role(hosts={"hq": pub}, vici_socket=right.vici_socket, ike_address=right.gateway_ike_address,
                           protected=protected or [f"{right.inside_address}/32"], pool=pool, pool6=pool6,
                           sweep_interval=0.2)))


@contextmanager
def running_agent(lab: Lab, dir: Path, config: Path, *, host: str = "127.0.0.1", **settings: Any) -> Iterator[AgentEnv]:
    """The app with agent config ``config`` and a fresh database in ``dir``, served by a real uvicorn
    on ``host`` in a thread of this process; stopped on the way out. ``settings``: more :class:`Settings`."""
    config_settings = Settings(database_url=f"sqlite:///{dir}/qoss.db", vici_socket_dirs=[lab.state_dir],
                               reconcile_on_start=False, agent_config=config, **settings)
    prepare_database(config_settings)
    admin = {"Authorization": f"Bearer {make_token(config_settings.database_url, 'agent-admin', ['admin'])}"}
    port = free_port(host)
    app = create_app(config_settings, vici_factory=lambda p: RegisteringVici(p, 15.0))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", http="httptools"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert server.started
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        yield AgentEnv(lab, dir, url, admin, config_settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentEnv]:
    with temporary_lab("ag") as lab:
        dir = tmp_path_factory.mktemp("agent")
        # A refusal window too short to hold two requests: each attack's refusal is recorded on its
        # own, with its reason (a flood's count: tests/api/test_agent_audit_flood.py).
        with running_agent(lab, dir, server_config(dir, lab), agent_rate=1000.0, agent_burst=1000,
                           agent_user_rate=1000.0, agent_user_burst=1000, audit_refusal_window=1e-6) as env:
            yield env
