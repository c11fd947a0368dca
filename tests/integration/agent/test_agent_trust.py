"""Device trust against real charons, with Host and Target as separate servers (each its own
uvicorn on loopback and its own SQLite database) and a second Host, ``branch``, at the same
Target: branch's own "alice" cannot see or end hq's alice's tunnel; a user's devices stop at
``devices_per_user`` (409, relayed by Host) while another user still joins; a revocation sent
while Target is down is kept by Host and gets through once Target is back, taking the tunnel
down.
The same at the service level on SQLite and PostgreSQL: ``tests/unit/services/test_agent_trust.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, select

from app.adapters.agent.crypto import CRYPTO, KeyPair, load_keys, write_keys
from app.adapters.agent.transport import RemoteRefused, post_message
from app.adapters.db.agent_rows import AgentPendingRevocationRow
from app.bootstrap import prepare_database
from app.domain.agent import Kind, RequestInfo
from app.lab.agent_configs import client_config, host_role, server_config, target_role, write_config
from app.lab.hosts import Lab
from app.main import create_app
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import register_keys
from tests.integration.agent.conftest import RegisteringVici, free_port
from tests.integration.charon.conftest import temporary_lab

pytestmark = pytest.mark.charon

POOL = "10.3.0.0/28"


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@dataclass
class Server:
    """One qoss server of the test (a uvicorn in a thread), its URL and an admin's headers."""

    name: str
    settings: Settings
    port: int
    admin: dict[str, str]
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        app = create_app(self.settings, vici_factory=lambda p: RegisteringVici(p, 15.0))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   http="httptools"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert wait_for(lambda: self.server is not None and self.server.started, 30, 0.05), f"{self.name} did not start"

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=15)
            assert not self.thread.is_alive(), f"{self.name} did not stop"
        self.server = self.thread = None


@dataclass
class Trust:
    lab: Lab
    dir: Path
    far: Server
    hq: Server
    branch: Server

    def enroll(self, host: Server, user: str) -> None:
        """Enrol ``user`` at ``host`` with a key pair of their own (in a directory of that Host's users)."""
        keys = KeyPair.generate(user)
        register_keys(keys)
        write_keys(keys, self.dir / f"{host.name}-users", overwrite=True)
        r = httpx.post(f"{host.url}/v1/agent/users", headers=host.admin, timeout=10, json={
            "user_id": user, "objectives": [3], **keys.public.as_dict()})
        assert r.status_code == 201, r.text

    def client(self, host: Server, user: str) -> AgentClient:
        left, keys = self.lab.host("left"), self.dir / f"{host.name}-users"
        path = write_config(self.dir / f"client-{host.name}-{user}.yaml", client_config(
            user=user, key_dir=keys, host_id=host.name, host_url=host.url,
            host_key=self.dir / "keys" / f"{host.name}.pub.json", targets={"far": self.dir / "keys" / "far.pub.json"},
            vici_socket=left.vici_socket, state_dir=self.dir / f"state-{host.name}-{user}",
            ike_address=left.gateway_ike_address), client=True)
        config = load_client_config(path)
        return AgentClient(config=config, keys=load_keys(config.key_dir, user), crypto=CRYPTO,
                           vici=RegisteringVici(config.vici_socket, timeout=20.0), post=post_message)

    @property
    def target_conns(self) -> list[str]:
        return [c for c in self.lab.host("right").gateway(timeout=5.0).list_conns() if c.startswith("qoss-agent-")]


def _server(dir: Path, lab: Lab, name: str, config: dict[str, Any]) -> Server:
    (dir / name).mkdir()
    path = write_config(dir / name / "agent.yaml", config)
    settings = Settings(database_url=f"sqlite:///{dir / name}/qoss.db", vici_socket_dirs=[lab.state_dir],
                        reconcile_on_start=False, agent_config=path, agent_user_rate=1000.0,
                        agent_user_burst=1000, agent_rate=1000.0, agent_burst=1000)
    prepare_database(settings)
    admin = {"Authorization": f"Bearer {make_token(settings.database_url, 'trust-admin', ['admin'])}"}
    return Server(name, settings, free_port(), admin)


@pytest.fixture(scope="module")
def trust(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trust]:
    with temporary_lab("tr") as lab:
        dir = tmp_path_factory.mktemp("trust")
        for name in ("far", "hq", "branch"):
            keys = KeyPair.generate(name)
            register_keys(keys)
            write_keys(keys, dir / "keys")
        pub: Callable[[str], Path] = lambda name: dir / "keys" / f"{name}.pub.json"  # noqa: E731 -- a one-line helper
        right = lab.host("right")
        far = _server(dir, lab, "far", server_config(id="far", key_dir=dir / "keys", target=target_role(
            hosts={"hq": pub("hq"), "branch": pub("branch")}, vici_socket=right.vici_socket,
            ike_address=right.gateway_ike_address, protected=[f"{right.inside_address}/32"], pool=POOL,
            sweep_interval=0.2)))
        hosts = [_server(dir, lab, name, server_config(id=name, key_dir=dir / "keys", host=host_role(
            {"far": (f"http://127.0.0.1:{far.port}", pub("far"))}))) for name in ("hq", "branch")]
        env = Trust(lab, dir, far, *hosts)
        try:
            for server in (far, *hosts):
                server.start()
            yield env
        finally:
            for server in (*hosts, far):
                server.stop()


def test_another_hosts_alice_neither_sees_nor_ends_alices_tunnel(trust: Trust) -> None:
    trust.enroll(trust.hq, "alice")
    trust.enroll(trust.branch, "alice")
    alice, impostor = trust.client(trust.hq, "alice"), trust.client(trust.branch, "alice")
    report = alice.connect(target="far", objective_id=3)
    try:
        for kind in (Kind.STATUS, Kind.DISCONNECT):
            _, wire = impostor.request(kind, RequestInfo(target="far", ticket=report["ticket"]), 3)
            r = httpx.post(f"{trust.branch.url}/v1/agent/requests", json={"message": wire.decode("latin-1")},
                           timeout=30)
            assert r.status_code == 403, r.text
        assert report["conn"] in trust.target_conns
        assert trust.lab.host("right").gateway(timeout=5.0).list_sas(ike=report["conn"])
        pool = httpx.get(f"{trust.far.url}/v1/agent/pool", headers=trust.far.admin, timeout=30).json()
        assert (pool["size"], pool["leased"]) == (14, 1)
        assert pool["holders"] == [{"host": "hq", "user_id": "alice", "devices": 0, "tunnels": 1}]
        r = httpx.delete(f"{trust.branch.url}/v1/agent/users/alice", headers=trust.branch.admin, timeout=30)
        assert r.json()["targets"] == {"far": "confirmed: 0 tunnels closed"}  # branch's alice had none
        assert report["conn"] in trust.target_conns
        [status] = alice.status()
        assert status["in_charon"]
        request, wire = alice.request(Kind.STATUS, RequestInfo(target="far", ticket=report["ticket"]), 3)
        found = alice.accept(post_message(f"{trust.hq.url}/v1/agent/requests", wire), request).status
        assert found is not None
        assert found.state.value == "active"  # her own Host's alice still sees it
    finally:
        alice.disconnect(report["ticket"])
    assert report["conn"] not in trust.target_conns


def test_a_revocation_sent_while_target_is_down_gets_through_when_it_is_back(trust: Trust) -> None:
    trust.enroll(trust.hq, "bob")
    bob = trust.client(trust.hq, "bob")
    report = bob.connect(target="far", objective_id=3)
    try:
        trust.far.stop()
        r = httpx.delete(f"{trust.hq.url}/v1/agent/users/bob", headers=trust.hq.admin, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["targets"]["far"].startswith("not confirmed: agent peer unreachable")
        # Target's charon still holds bob's tunnel: nothing told it otherwise.
        assert report["conn"] in trust.target_conns
        engine = create_engine(trust.hq.settings.database_url)
        try:
            with engine.connect() as conn:
                kept = conn.execute(select(AgentPendingRevocationRow.user_id, AgentPendingRevocationRow.target_id)
                                    ).all()
            assert [tuple(row) for row in kept] == [("bob", "far")]
            users = httpx.get(f"{trust.hq.url}/v1/agent/users", headers=trust.hq.admin, timeout=30).json()
            [listed] = [u for u in users if u["user_id"] == "bob"]
            assert listed["unconfirmed"]["far"]["attempts"] == 1
            trust.far.start()
            # Host sends it again 5 s after the failure (its resender looks every 2 s).
            assert wait_for(lambda: report["conn"] not in trust.target_conns, 30), "the tunnel stayed up"

            def forgotten() -> bool:  # Host forgets it once Target's answer is in
                with engine.connect() as conn:
                    return conn.execute(select(AgentPendingRevocationRow.user_id)).all() == []

            assert wait_for(forgotten, 10), "Host still waits for Target's confirmation"
        finally:
            engine.dispose()
        r = httpx.get(f"{trust.far.url}/v1/agent/revocations", headers=trust.far.admin, timeout=30)
        assert [e["host"] for e in r.json() if e["user_id"] == "bob"] == ["hq"]
        assert not trust.lab.host("right").gateway(timeout=5.0).list_sas(ike=report["conn"])
    finally:
        if trust.far.server is None:
            trust.far.start()
        bob.disconnect()


def test_a_users_devices_stop_at_the_quota_through_a_remote_host_and_others_still_join(trust: Trust) -> None:
    trust.enroll(trust.hq, "carol")
    trust.enroll(trust.hq, "dave")
    carol, dave = trust.client(trust.hq, "carol"), trust.client(trust.hq, "dave")
    out = trust.dir / "carol-devices"
    tickets = [carol.enrol_device(target="far", objective_id=3, platform="swanctl", out_dir=out / str(n))["ticket"]
               for n in range(3)]  # devices_per_user: 3 by default
    try:
        with pytest.raises(RemoteRefused) as info:
            carol.enrol_device(target="far", objective_id=3, platform="swanctl", out_dir=out / "3")
        assert info.value.status == 409
        assert "carol (of host hq) has 3 devices" in str(info.value.detail())
        assert "devices_per_user (3)" in str(info.value.detail())
        assert not (out / "3").exists()
        pool = httpx.get(f"{trust.far.url}/v1/agent/pool", headers=trust.far.admin, timeout=30).json()
        assert (pool["leased"], pool["devices_per_user"]) == (3, 3)
        assert pool["holders"] == [{"host": "hq", "user_id": "carol", "devices": 3, "tunnels": 0}]
        # dave is not starved: he enrols a device and brings a tunnel up.
        dave_device = dave.enrol_device(target="far", objective_id=3, platform="swanctl", out_dir=trust.dir / "dave")
        report = dave.connect(target="far", objective_id=3)
        try:
            assert report["conn"] in trust.target_conns
        finally:
            dave.disconnect(report["ticket"])
            dave.revoke_device(dave_device["ticket"])
        # A device revoked by carol makes room for another.
        carol.revoke_device(tickets.pop())
        tickets.append(carol.enrol_device(target="far", objective_id=3, platform="swanctl",
                                          out_dir=out / "4")["ticket"])
    finally:
        for ticket in tickets:
            carol.revoke_device(ticket)
    assert not trust.target_conns
