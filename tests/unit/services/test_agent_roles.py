"""The agent's Host and Target roles on the fakes (``tests/fakes/agent_store.py``, the VICI
wire fake ``tests/fakes/fake_charon.py``, the in-memory unit of work): no database, no charon.
Connect, replay, disconnect, revocation, a refused load, expiry and reconcile, each checked in
the store and in what charon holds. The same roles against SQLite and a real charon:
``tests/integration/agent``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from app.adapters import files
from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.adapters.agent.devices import LocalDeviceKit
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import AgentRejected, AgentSessionState, Kind, RequestInfo, Response, agent_conn_name
from app.domain.agent.messages import Endorsement
from app.domain.agent.ports import DeviceKit
from app.domain.errors import GatewayRejected
from app.domain.tunnels import keywords_from_charon
from app.services import policies
from app.services.agent.client import AgentClient
from app.services.agent.config import AgentConfig, ClientConfig, HostRole, Party, TargetRole
from app.services.agent.host import HostAgent
from app.services.agent.target import Outcome, TargetAgent
from app.services.agent.target_sessions import RECONCILE_GRACE
from app.settings import SHIPPED_POLICIES_DIR
from tests.fakes.agent_store import FakeAgentStore
from tests.fakes.fake_charon import FakeCharon
from tests.fakes.uow import FakeDatabase

SERVER = KeyPair.generate("hq")
TARGET = KeyPair.generate("far")
ALICE = KeyPair.generate("alice")
POOL = "10.3.8.0/29"


def gateway(path: str) -> ViciGateway:
    return ViciGateway(path, timeout=2.0)


def loads(charon: FakeCharon) -> list[str]:
    """The commands that changed what ``charon`` holds, in order."""
    return [c for c in charon.commands if c.startswith(("load-", "unload-"))]


def empty(charon: FakeCharon) -> bool:
    """Nothing of the agent's is loaded."""
    return not (charon.conns or charon.shared or charon.pools)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Roles:
    """Host and Target in one process (``url: local``) on the fakes, and alice's client."""

    def __init__(self, database: FakeDatabase, tmp_path: Path, stack: ExitStack,
                 devices: DeviceKit | None = None) -> None:
        self.clock = Clock()
        self.tmp_path = tmp_path
        self.store = FakeAgentStore()
        self.charon = stack.enter_context(FakeCharon(tmp_path / "target.vici"))
        self.client_charon = stack.enter_context(FakeCharon(tmp_path / "client.vici"))
        me = Party(**SERVER.public.as_dict())
        config = AgentConfig(
            id="hq", key_dir=tmp_path, host=HostRole(targets={"hq": Party(url="local", **SERVER.public.as_dict())}),
            target=TargetRole(hosts={"hq": me}, vici_socket=self.charon.socket_path, ike_address="10.99.0.3",
                              protected=["10.3.0.1/32"], pool=POOL))
        self.target = TargetAgent(config=config, keys=SERVER, crypto=CRYPTO, store=self.store, units=database.unit,
                                  vici=gateway, default_table="standards-2026",
                                  clock=self.clock, devices=devices)
        self.host = HostAgent(config=config, keys=SERVER, crypto=CRYPTO, store=self.store, local_target=self.target,
                              post=self._unreachable, clock=self.clock)
        self.client = self.client_of("alice", ALICE, state="state")
        self.host.enroll(user_id="alice", objectives=[1, 3], **ALICE.public.as_dict())

    def client_of(self, user: str, keys: KeyPair, *, state: str, host: dict[str, str] | None = None,
                  target: dict[str, str] | None = None) -> AgentClient:
        """A client of ``user`` with ``keys`` on the client charon, knowing Host (and Target ``hq``)
        by ``host``'s (``target``'s) public keys, by default all of Host's; its state under ``state``."""
        host = host if host is not None else SERVER.public.as_dict()
        return AgentClient(
            config=ClientConfig(user=user, key_dir=self.tmp_path, host={"id": "hq", "url": "http://127.0.0.1:9",
                                                                        **host},
                                targets={"hq": Party(**(target if target is not None else SERVER.public.as_dict()))},
                                vici_socket=self.client_charon.socket_path, state_dir=self.tmp_path / state),
            keys=keys, crypto=CRYPTO, vici=gateway(self.client_charon.socket_path), post=self._unreachable,
            clock=self.clock)

    @staticmethod
    def _unreachable(url: str, wire: bytes) -> bytes:
        raise AssertionError(f"nothing is posted in these tests ({url})")

    def connect(self, objective_id: int = 3) -> tuple[str, str]:
        """(ticket, protection) of a connect through Host."""
        supports = tuple(sorted(keywords_from_charon(self.charon.algorithms)))
        request, wire = self.client.request(Kind.CONNECT, RequestInfo(target="hq", supports=supports), objective_id)
        response = self.client.accept(self.host.handle(wire).answer, request)
        assert response.tunneling_info is not None
        return response.tunneling_info.ticket, response.tunneling_info.protection

    def disconnect(self, ticket: str) -> Kind:
        request, wire = self.client.request(Kind.DISCONNECT, RequestInfo(target="hq", ticket=ticket), 3)
        return self.client.accept(self.host.handle(wire).answer, request).kind

    def restart_charon(self) -> None:
        """Target's charon restarted (its conns, secrets and pools gone), and the reconcile's grace
        for what it lost passed."""
        self.charon.conns.clear()
        self.charon.shared.clear()
        self.charon.pools.clear()
        self.clock.now += RECONCILE_GRACE + 1

    def session(self, ticket: str) -> tuple[str, str | None, set[str]]:
        """The session's state, virtual IP, and the addresses leased now."""
        with self.store.unit() as uow:
            found = uow.sessions.get(ticket)
            assert found is not None
            return found.state, found.virtual_ip, uow.leases.taken()


@contextmanager
def rejected(reason: str) -> Iterator[None]:
    """The block raises :class:`AgentRejected` for a reason that starts with ``reason``."""
    with pytest.raises(AgentRejected) as info:
        yield
    assert info.value.reason.startswith(reason), info.value.reason


@pytest.fixture
def roles(database: FakeDatabase, tmp_path: Path) -> Iterator[Roles]:
    with ExitStack() as stack:
        yield Roles(database, tmp_path, stack)


@pytest.fixture
def device_roles(database: FakeDatabase, tmp_path: Path) -> Iterator[Roles]:
    """:class:`Roles` whose Target enrols devices: the shipped policies, a local CA for ``hq.qoss``."""
    with database.unit() as uow:
        policies.load_shipped_policies(uow=uow, policies=files.load_policies(SHIPPED_POLICIES_DIR))
        uow.commit()
    with ExitStack() as stack:
        yield Roles(database, tmp_path, stack, devices=LocalDeviceKit(tmp_path / "ca", owner="hq.qoss",
                                                                     gateway_addresses=["10.99.0.3"]))


def enrol_device(roles: Roles, platform: str, **levels: int) -> Response:
    """Alice's enrolment of a ``platform`` device through Host with minimum ``levels``: the answer."""
    info = RequestInfo(target="hq", min_levels=levels, platform=platform)
    request, wire = roles.client.request(Kind.CONNECT, info, 3)
    return roles.client.accept(roles.host.handle(wire).answer, request)


def writes(caplog: pytest.LogCaptureFixture) -> list[list[str]]:
    """The commands the Target's charon got in each pipelined write, from the gateway's log."""
    return [r.getMessage().split()[1].split(",") for r in caplog.records
            if r.name == "app.adapters.vici.gateway" and r.getMessage().endswith("(pipelined)")
            and "target.vici" in r.getMessage()]


def test_a_connect_is_recorded_leased_and_loaded_into_charon_in_one_write(roles: Roles,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="app.adapters.vici.gateway")
    ticket, protection = roles.connect()
    conn = agent_conn_name(ticket)
    state, vip, leased = roles.session(ticket)
    assert (protection, state) == ("esp", "active")
    assert vip is not None
    assert leased == {vip}
    assert roles.charon.pools == {conn: {"addrs": f"{vip}/32"}}
    assert set(roles.charon.conns) == set(roles.charon.shared) == {conn}
    assert writes(caplog) == [["load-shared", "load-conn"], ["load-pool"]]  # no lease hint yet
    roles.connect()
    assert writes(caplog)[-1] == ["load-shared", "load-conn", "load-pool"]  # the pool on the hint
    assert loads(roles.charon) == ["load-shared", "load-conn", "load-pool"] * 2


def test_a_native_connect_configures_nothing(roles: Roles) -> None:
    ticket, protection = roles.connect(objective_id=1)
    assert protection == "native"
    assert empty(roles.charon)
    assert loads(roles.charon) == []
    with roles.store.unit() as uow:
        assert uow.sessions.get(ticket) is None


def test_a_replayed_request_is_refused_and_configures_nothing_more(roles: Roles) -> None:
    supports = tuple(sorted(keywords_from_charon(roles.charon.algorithms)))
    _, wire = roles.client.request(Kind.CONNECT, RequestInfo(target="hq", supports=supports), 3)
    roles.host.handle(wire)
    with rejected("replayed request"):
        roles.host.handle(wire)
    assert len(roles.charon.conns) == 1


def test_a_request_refused_by_admit_spends_no_nonce(roles: Roles) -> None:
    _, wire = roles.client.request(Kind.CONNECT, RequestInfo(target="hq"), 1)

    def full(user_id: str) -> None:
        raise RuntimeError(f"{user_id}: rate limited")

    with pytest.raises(RuntimeError, match="rate limited"):
        roles.host.handle(wire, admit=full)
    roles.host.handle(wire)  # the same request, later: not a replay


def test_a_disconnect_closes_the_session_releases_the_lease_and_unloads(roles: Roles) -> None:
    ticket, _ = roles.connect()
    assert roles.disconnect(ticket) is Kind.CLOSED
    assert roles.session(ticket)[0] == "closed"
    assert roles.session(ticket)[2] == set()
    assert empty(roles.charon)
    with rejected("target rejected: ticket unknown"):
        roles.disconnect(ticket)


def test_a_refused_disconnect_still_uses_up_its_nonces_and_ends_nothing(
        roles: Roles, monkeypatch: pytest.MonkeyPatch) -> None:
    ticket, _ = roles.connect()
    endorsements: list[Endorsement] = []
    answer = roles.target.handle_local

    def kept(endorsement: Endorsement) -> Outcome:
        endorsements.append(endorsement)
        return answer(endorsement)

    monkeypatch.setattr(roles.target, "handle_local", kept)
    with rejected("target rejected: ticket unknown"):
        roles.disconnect("f" * 32)
    [refused] = endorsements
    with rejected("replayed endorsement"):  # its nonces were kept though the disconnect was refused
        answer(refused)
    assert roles.session(ticket)[0] == "active"  # and nobody else's session ended
    assert roles.disconnect(ticket) is Kind.CLOSED


def test_revoking_a_user_ends_their_sessions_and_refuses_their_key(roles: Roles) -> None:
    ticket, _ = roles.connect()
    result = roles.host.revoke("alice")
    assert result["targets"] == {"hq": "confirmed: 1 tunnels closed"}
    assert roles.session(ticket)[0] == "revoked"
    assert empty(roles.charon)
    assert [r["user_id"] for r in roles.target.revocations()] == ["alice"]
    with rejected("revoked user alice"):
        roles.connect()


def test_a_pool_charon_still_counts_a_lease_in_is_unloaded_once_the_lease_is_gone(roles: Roles) -> None:
    """A forced terminate returns before charon has destroyed the IKE_SA and freed its lease:
    the pool's unload is refused for a moment, and tried again until it goes."""
    ticket, _ = roles.connect()
    conn = agent_conn_name(ticket)
    roles.charon.fail("unload-pool", f"unload-pool: {conn} has online leases, unable to unload", once=True)
    assert roles.disconnect(ticket) is Kind.CLOSED
    assert empty(roles.charon)
    assert loads(roles.charon)[-2:] == ["unload-pool", "unload-pool"]


def test_a_disconnect_asks_charon_once_terminate_then_every_unload(roles: Roles) -> None:
    """No list-sas first: terminating nothing is refused harmlessly, and each of the commands is
    written at once (one batch) and run in order."""
    ticket, _ = roles.connect()
    before = len(roles.charon.commands)
    assert roles.disconnect(ticket) is Kind.CLOSED
    assert roles.charon.commands[before:] == ["terminate", "unload-conn", "unload-shared", "unload-pool"]
    assert empty(roles.charon)


def test_an_unload_charon_refuses_at_a_disconnect_is_logged_not_asked_again(
        roles: Roles, caplog: pytest.LogCaptureFixture) -> None:
    ticket, _ = roles.connect()
    conn = agent_conn_name(ticket)
    roles.charon.fail("unload-shared", "unloading shared secret failed")
    before = len(roles.charon.commands)
    with caplog.at_level(logging.WARNING, logger="qoss.agent.target"):
        assert roles.disconnect(ticket) is Kind.CLOSED
    assert roles.charon.commands[before:] == ["terminate", "unload-conn", "unload-shared", "unload-pool"]
    assert f"could not unload shared {conn}: unload-shared: unloading shared secret failed" in caplog.text


def test_a_load_charon_refuses_unloads_the_others_and_fails_the_session(roles: Roles) -> None:
    roles.charon.fail("load-pool", "bad address")
    with pytest.raises(GatewayRejected, match="bad address"):
        roles.connect()
    assert empty(roles.charon)
    [failed] = roles.target.sessions()
    assert failed["state"] == "failed"
    assert failed["reason"].startswith("charon: ")
    assert "bad address" in failed["reason"]
    assert roles.session(failed["ticket"])[2] == set()


def test_the_sweep_ends_expired_sessions(roles: Roles) -> None:
    ticket, _ = roles.connect()
    roles.clock.now += 3600 + 1
    assert roles.target.sweep() == [ticket]
    assert roles.session(ticket)[0] == AgentSessionState.EXPIRED.value
    assert empty(roles.charon)


def test_reconcile_unloads_orphans_seen_twice_and_ends_sessions_whose_conn_vanished(roles: Roles) -> None:
    ticket, _ = roles.connect()
    roles.charon.conns["qoss-agent-orphan"] = {}
    roles.charon.conns.pop(agent_conn_name(ticket))
    roles.clock.now += RECONCILE_GRACE + 1  # the session is settled
    first = roles.target.reconcile()
    assert (first.orphans, first.vanished) == ([], [ticket])
    assert roles.session(ticket)[0] == "failed"
    assert roles.target.reconcile().orphans == ["qoss-agent-orphan"]
    assert "qoss-agent-orphan" not in roles.charon.conns


def test_host_endorses_to_a_remote_target_that_opens_and_answers(roles: Roles, database: FakeDatabase,
                                                                  tmp_path: Path) -> None:
    target_store = FakeAgentStore()
    charon = FakeCharon(tmp_path / "far.vici").start()
    far = TargetAgent(
        config=AgentConfig(id="far", key_dir=tmp_path, target=TargetRole(
            hosts={"hq": Party(**SERVER.public.as_dict())}, vici_socket=charon.socket_path, ike_address="10.99.0.4",
            protected=["10.4.0.1/32"], pool=POOL)),
        keys=TARGET, crypto=CRYPTO, store=target_store, units=database.unit, vici=gateway,
        default_table="standards-2026", clock=roles.clock)
    posted: list[str] = []

    def post(url: str, wire: bytes) -> bytes:
        posted.append(url)
        return far.handle(wire).answer

    host = HostAgent(config=AgentConfig(id="hq", key_dir=tmp_path, host=HostRole(targets={
        "far": Party(url="http://far:8000", **TARGET.public.as_dict())})),
        keys=SERVER, crypto=CRYPTO, store=roles.store, post=post, clock=roles.clock)
    client = AgentClient(
        config=roles.client.config.model_copy(update={"targets": {"far": Party(**TARGET.public.as_dict())}}),
        keys=ALICE, crypto=CRYPTO, vici=gateway(roles.client_charon.socket_path), post=post, clock=roles.clock)
    supports = tuple(sorted(keywords_from_charon(charon.algorithms)))
    request, wire = client.request(Kind.CONNECT, RequestInfo(target="far", supports=supports), 3)
    response = client.accept(host.handle(wire).answer, request)
    assert posted == ["http://far:8000/v1/agent/target/requests"]
    assert response.tunneling_info is not None
    assert set(charon.conns) == {agent_conn_name(response.tunneling_info.ticket)}
    with target_store.unit() as uow:
        assert [s.user_id for s in uow.sessions.select()] == ["alice"]
    charon.stop()
