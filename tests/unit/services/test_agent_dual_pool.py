"""A Target with a dual pool (``pool`` IPv4, ``pool6`` IPv6) on the fakes: each client gets an
address of each family, the IPv6 one at the IPv4 one's offset, and both pools go with the
session. The same against a real charon: ``tests/integration/agent/test_agent_ipv6.py``."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import Kind, RequestInfo, agent_conn_name
from app.domain.agent.conns import pool6_name, target_conn
from app.domain.errors import GatewayRejected
from app.domain.tunnels import keywords_from_charon
from app.services.agent.client import AgentClient
from app.services.agent.config import AgentConfig, ClientConfig, HostRole, Party, TargetRole
from app.services.agent.host import HostAgent
from app.services.agent.target import TargetAgent
from app.services.agent.target_charon import TargetCharon
from app.services.agent.target_sessions import TargetSessions
from tests.fakes.agent_store import FakeAgentStore
from tests.fakes.fake_charon import FakeCharon, Reply
from tests.fakes.uow import FakeDatabase

SERVER = KeyPair.generate("hq")
ALICE = KeyPair.generate("alice")
POOL, POOL6 = "10.3.8.0/29", "fd08::/125"
PROTECTED = ["10.3.0.1/32", "fd02::/64"]


def _gateway(path: str) -> ViciGateway:
    return ViciGateway(path, timeout=2.0)


def _role(**changes: object) -> TargetRole:
    fields: dict[str, object] = {
        "hosts": {"hq": Party(**SERVER.public.as_dict())}, "vici_socket": "/nonexistent/charon.vici",
        "ike_address": "fd00:71::2", "protected": PROTECTED, "pool": POOL, "pool6": POOL6, **changes}
    return TargetRole(**fields)


class DualRoles:
    """Host and Target in one process on the fakes, Target with a dual pool; alice's client."""

    def __init__(self, database: FakeDatabase, tmp_path: Path, stack: ExitStack) -> None:
        self.store = FakeAgentStore()
        self.charon = stack.enter_context(FakeCharon(tmp_path / "target.vici"))
        client_charon = stack.enter_context(FakeCharon(tmp_path / "client.vici"))
        me = Party(**SERVER.public.as_dict())
        config = AgentConfig(id="hq", key_dir=tmp_path,
                             host=HostRole(targets={"hq": Party(url="local", **SERVER.public.as_dict())}),
                             target=_role(vici_socket=self.charon.socket_path))
        self.target = TargetAgent(config=config, keys=SERVER, crypto=CRYPTO, store=self.store, units=database.unit,
                                  vici=_gateway, default_table="standards-2026")
        self.host = HostAgent(config=config, keys=SERVER, crypto=CRYPTO, store=self.store, local_target=self.target,
                              post=self._unreachable)
        self.client = AgentClient(
            config=ClientConfig(user="alice", key_dir=tmp_path, host={"id": "hq", "url": "http://[::1]:9",
                                                                      **SERVER.public.as_dict()},
                                targets={"hq": me}, vici_socket=client_charon.socket_path,
                                state_dir=tmp_path / "state"),
            keys=ALICE, crypto=CRYPTO, vici=_gateway(client_charon.socket_path), post=self._unreachable)
        self.host.enroll(user_id="alice", objectives=[3], **ALICE.public.as_dict())

    @staticmethod
    def _unreachable(url: str, wire: bytes) -> bytes:
        raise AssertionError(f"nothing is posted in these tests ({url})")

    def connect(self) -> str:
        supports = tuple(sorted(keywords_from_charon(self.charon.algorithms)))
        request, wire = self.client.request(Kind.CONNECT, RequestInfo(target="hq", supports=supports), 3)
        response = self.client.accept(self.host.handle(wire).answer, request)
        assert response.tunneling_info is not None
        return response.tunneling_info.ticket

    def disconnect(self, ticket: str) -> Kind:
        request, wire = self.client.request(Kind.DISCONNECT, RequestInfo(target="hq", ticket=ticket), 3)
        return self.client.accept(self.host.handle(wire).answer, request).kind

    def virtual_ip(self, ticket: str) -> str:
        with self.store.unit() as uow:
            found = uow.sessions.get(ticket)
        assert found is not None
        assert found.virtual_ip is not None
        return found.virtual_ip


@pytest.fixture
def roles(database: FakeDatabase, tmp_path: Path) -> Iterator[DualRoles]:
    with ExitStack() as stack:
        yield DualRoles(database, tmp_path, stack)


def _companion(vip: str) -> str:
    offset = int(ipaddress.ip_address(vip)) - int(ipaddress.ip_network(POOL).network_address)
    return str(ipaddress.ip_network(POOL6).network_address + offset)


def test_a_dual_pool_is_an_ipv4_pool_and_an_ipv6_pool_at_least_as_large() -> None:
    assert _role().pool6 == POOL6
    assert _role(pool6=None).pool6 is None
    for bad in ({"pool6": "10.4.0.0/29"}, {"pool": "fd09::/125"}, {"pool6": "fd08::/126"}, {"pool6": "fd08::/64"}):
        with pytest.raises(ValidationError):
            _role(**bad)


def test_the_companion_is_at_the_same_offset_in_pool6() -> None:
    sessions = TargetSessions(store=FakeAgentStore(), charon=TargetCharon(vici=_gateway, socket="/nonexistent"),
                              pool="10.3.8.0/24", pool6="fd08::/120")
    assert sessions.companion("10.3.8.1") == "fd08::1"
    assert sessions.companion("10.3.8.254") == "fd08::fe"
    single = TargetSessions(store=FakeAgentStore(), charon=TargetCharon(vici=_gateway, socket="/nonexistent"),
                            pool="10.3.8.0/24")
    assert single.companion("10.3.8.1") is None


def test_target_conn_names_both_pools() -> None:
    body = target_conn(name="c", target_address="fd00:71::2", target_identity="t", client_identity="a",
                       client_address=None, local_ts=PROTECTED, pool="c", pool6=pool6_name("c"), ike_proposal="i",
                       esp_proposal="e", mode="tunnel", ike_lifetime=3600, child_lifetime=3600)
    assert body["pools"] == ["c", "c-6"]
    assert target_conn(name="c", target_address="fd00:71::2", target_identity="t", client_identity="a",
                       client_address=None, local_ts=PROTECTED, pool="c", ike_proposal="i", esp_proposal="e",
                       mode="tunnel", ike_lifetime=3600, child_lifetime=3600)["pools"] == ["c"]


def test_a_connect_loads_both_pools_and_a_disconnect_unloads_them(roles: DualRoles) -> None:
    for _ in range(2):  # the first without a lease hint, the second on it
        ticket = roles.connect()
        conn, vip = agent_conn_name(ticket), roles.virtual_ip(ticket)
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
        assert roles.charon.pools[conn] == {"addrs": f"{vip}/32"}
        assert roles.charon.pools[pool6_name(conn)] == {"addrs": f"{_companion(vip)}/128"}
        assert roles.charon.conns[conn]["pools"] == [conn, pool6_name(conn)]
        assert roles.disconnect(ticket) is Kind.CLOSED
        assert (roles.charon.conns, roles.charon.shared, roles.charon.pools) == ({}, {}, {})


def test_a_refused_ipv6_pool_unloads_everything(roles: DualRoles) -> None:
    def refuse_ipv6(message: dict[str, Any]) -> Reply:
        if any(name.endswith("-6") for name in message):
            return Reply({"success": "no", "errmsg": "bad address"})
        roles.charon.pools.update(message)
        return Reply({"success": "yes"})

    roles.charon.script("load-pool", refuse_ipv6)
    with pytest.raises(GatewayRejected, match="bad address"):
        roles.connect()
    assert (roles.charon.conns, roles.charon.shared, roles.charon.pools) == ({}, {}, {})
    assert [s["state"] for s in roles.target.sessions()] == ["failed"]
