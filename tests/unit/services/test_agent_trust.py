"""Device trust on Target's side, on the SQL store (SQLite and PostgreSQL, migrated) and the VICI
wire fake: one user cannot use up the virtual-IP pool (a per-user device quota, 409; a pool
really full is 503 ``PoolExhausted``); users are scoped by their Host (a second Host's "alice"
neither sees, ends nor revokes the first Host's alice, and its revocation bars only its own
alice); a revocation a Target did not get is kept by Host and sent again until confirmed, and
the user may still revoke their own devices meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from app.adapters import files
from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.adapters.agent.devices import LocalDeviceKit
from app.adapters.agent.transport import PeerUnreachable
from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import (
    AgentRejected,
    AgentSessionState,
    DeviceQuotaExceeded,
    Kind,
    PoolExhausted,
    RequestInfo,
    Response,
    Revocation,
    TunnelQuotaExceeded,
    agent_conn_name,
)
from app.domain.agent.ports import AgentStore
from app.domain.tunnels import keywords_from_charon
from app.services import policies
from app.services.agent.client import AgentClient
from app.services.agent.config import AgentConfig, ClientConfig, HostRole, Party, TargetRole
from app.services.agent.host import HostAgent
from app.services.agent.host_revocations import RETRY_FIRST, RETRY_MAX, retry_delay
from app.services.agent.target import TargetAgent
from app.settings import SHIPPED_POLICIES_DIR
from app.web.errors import status_for
from tests.contract.databases import migrated_sessions
from tests.fakes.fake_charon import FakeCharon
from tests.fakes.uow import FakeDatabase

HQ, BRANCH, FAR = KeyPair.generate("hq"), KeyPair.generate("branch"), KeyPair.generate("far")
ALICE, OTHER_ALICE, BOB = KeyPair.generate("alice"), KeyPair.generate("alice"), KeyPair.generate("bob")
POOL = "10.3.8.0/29"  # six addresses
QUOTA = 2
TUNNELS = 3


def gateway(path: str) -> ViciGateway:
    return ViciGateway(path, timeout=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class User:
    """One Host's user: their client, the Host it talks to, and far's charon (what it offers)."""

    def __init__(self, host: HostAgent, client: AgentClient, charon: FakeCharon) -> None:
        self.host, self.client, self._charon = host, client, charon

    def send(self, kind: Kind, info: RequestInfo, objective_id: int = 3) -> Response:
        request, wire = self.client.request(kind, info, objective_id)
        return self.client.accept(self.host.handle(wire).answer, request)

    def connect(self) -> str:
        supports = tuple(sorted(keywords_from_charon(self._charon.algorithms)))
        info = self.send(Kind.CONNECT, RequestInfo(target="far", supports=supports)).tunneling_info
        assert info is not None
        return info.ticket

    def enrol(self, platform: str = "android") -> str:
        info = self.send(Kind.CONNECT, RequestInfo(target="far", platform=platform)).tunneling_info
        assert info is not None
        return info.ticket

    def status(self, ticket: str) -> str:
        found = self.send(Kind.STATUS, RequestInfo(target="far", ticket=ticket)).status
        assert found is not None
        return found.state.value

    def disconnect(self, ticket: str) -> Kind:
        return self.send(Kind.DISCONNECT, RequestInfo(target="far", ticket=ticket)).kind


class World:
    """Target ``far`` trusting two Hosts, ``hq`` and ``branch``, each on a database of its own
    (as separate machines are), Target on a third; both Hosts have a user called alice, with keys
    of her own; hq also has bob. ``far_up`` False: Host's messages to far do not get through."""

    def __init__(self, database: FakeDatabase, tmp_path: Path, stack: ExitStack,
                 stores: Callable[[str], AgentStore]) -> None:
        self.clock = Clock()
        self.far_up = True
        self.charon = stack.enter_context(FakeCharon(tmp_path / "far.vici"))
        self.target_store = stores("far")
        self.target = TargetAgent(
            config=AgentConfig(id="far", key_dir=tmp_path, target=TargetRole(
                hosts={"hq": Party(**HQ.public.as_dict()), "branch": Party(**BRANCH.public.as_dict())},
                vici_socket=self.charon.socket_path, ike_address="10.99.0.4", protected=["10.4.0.1/32"],
                pool=POOL, devices_per_user=QUOTA, tunnels_per_user=TUNNELS)),
            keys=FAR, crypto=CRYPTO, store=self.target_store, units=database.unit, vici=gateway,
            default_table="standards-2026", clock=self.clock,
            devices=LocalDeviceKit(tmp_path / "ca", owner="far.qoss", gateway_addresses=["10.99.0.4"]))
        self.posted: list[str] = []
        self.hosts = {name: self._host(name, keys, stores(name), tmp_path)
                      for name, keys in (("hq", HQ), ("branch", BRANCH))}
        self.alice = self._user("hq", "alice", ALICE, tmp_path)
        self.other_alice = self._user("branch", "alice", OTHER_ALICE, tmp_path)
        self.bob = self._user("hq", "bob", BOB, tmp_path)

    def post(self, url: str, wire: bytes) -> bytes:
        self.posted.append(url)
        if not self.far_up:
            raise PeerUnreachable(url, "connection refused")
        if url.endswith("/v1/agent/target/revocations"):
            return self.target.revoke(wire).answer
        return self.target.handle(wire).answer

    def _host(self, name: str, keys: KeyPair, store: AgentStore, tmp_path: Path) -> HostAgent:
        return HostAgent(config=AgentConfig(id=name, key_dir=tmp_path, host=HostRole(targets={
            "far": Party(url="http://far:8000", **FAR.public.as_dict())})),
            keys=keys, crypto=CRYPTO, store=store, post=self.post, clock=self.clock)

    def _user(self, host: str, user: str, keys: KeyPair, tmp_path: Path) -> User:
        self.hosts[host].enroll(user_id=user, objectives=[3], **keys.public.as_dict())
        host_keys = HQ if host == "hq" else BRANCH
        client = AgentClient(
            config=ClientConfig(user=user, key_dir=tmp_path, host={"id": host, "url": "http://127.0.0.1:9",
                                                                   **host_keys.public.as_dict()},
                                targets={"far": Party(**FAR.public.as_dict())}, vici_socket="/run/none.vici",
                                state_dir=tmp_path / f"state-{host}-{user}"),
            keys=keys, crypto=CRYPTO, vici=gateway("/run/none.vici"), post=self.post, clock=self.clock)
        return User(self.hosts[host], client, self.charon)

    def session(self, ticket: str) -> tuple[str, str | None]:
        with self.target_store.unit() as uow:
            found = uow.sessions.get(ticket)
        assert found is not None
        return found.state, found.virtual_ip

    def leased(self) -> set[str]:
        with self.target_store.unit() as uow:
            return uow.leases.taken()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, database: FakeDatabase, tmp_path: Path) -> Iterator[World]:
    with database.unit() as uow:
        policies.load_shipped_policies(uow=uow, policies=files.load_policies(SHIPPED_POLICIES_DIR))
        uow.commit()
    with ExitStack() as stack:

        def store(name: str) -> AgentStore:
            (tmp_path / name).mkdir()
            return SqlAgentStore(stack.enter_context(migrated_sessions(request.param, tmp_path / name)))

        yield World(database, tmp_path, stack, store)


# ------------------------------------------------------------------ pool and quota


def test_a_user_enrols_at_most_devices_per_user_and_the_next_is_a_409_naming_it(world: World) -> None:
    first, second = world.alice.enrol(), world.alice.enrol("apple")
    leased, conns = world.leased(), set(world.charon.conns)
    quota = r"alice \(of host hq\) has 2 devices .*devices_per_user \(2\)"
    with pytest.raises(DeviceQuotaExceeded, match=quota) as info:
        world.alice.enrol()
    assert status_for(info.value) == 409
    assert (world.leased(), set(world.charon.conns)) == (leased, conns)  # nothing leased, nothing loaded
    # Others are not starved: bob enrols, alice herself still connects.
    assert world.session(world.bob.enrol())[0] == "active"
    assert world.session(world.alice.connect())[0] == "active"
    # A device revoked by its user frees its place.
    assert world.alice.disconnect(first) is Kind.CLOSED
    assert world.session(world.alice.enrol())[0] == "active"
    assert world.session(second)[0] == "active"


def test_a_user_brings_up_at_most_tunnels_per_user_tunnels_and_the_next_is_a_409_naming_it(world: World) -> None:
    tunnels = [world.alice.connect() for _ in range(TUNNELS)]
    leased, conns = world.leased(), set(world.charon.conns)
    quota = r"alice \(of host hq\) has 3 tunnels .*tunnels_per_user \(3\)"
    with pytest.raises(TunnelQuotaExceeded, match=quota) as info:
        world.alice.connect()
    assert status_for(info.value) == 409
    assert (world.leased(), set(world.charon.conns)) == (leased, conns)
    assert world.session(world.alice.enrol())[0] == "active"  # devices are counted apart
    assert world.session(world.bob.connect())[0] == "active"  # others are not starved
    assert world.alice.disconnect(tunnels[0]) is Kind.CLOSED
    assert world.session(world.alice.connect())[0] == "active"


def test_the_quota_is_per_host_user_so_another_hosts_alice_enrols_her_own(world: World) -> None:
    world.alice.enrol()
    world.alice.enrol()
    assert world.session(world.other_alice.enrol())[0] == "active"


def test_a_pool_really_full_is_a_503_pool_exhausted_and_the_address_comes_back(world: World) -> None:
    tickets = [world.alice.enrol(), world.alice.enrol(), world.bob.enrol(), world.bob.enrol()]
    tickets += [world.alice.connect(), world.other_alice.connect()]
    assert len(world.leased()) == 6
    conns = set(world.charon.conns)
    with pytest.raises(PoolExhausted, match=r"10\.3\.8\.0/29") as info:
        world.other_alice.connect()
    assert status_for(info.value) == 503
    assert set(world.charon.conns) == conns  # the refused session left nothing loaded
    assert world.bob.disconnect(tickets[3]) is Kind.CLOSED
    assert world.session(world.other_alice.connect())[0] == "active"


def test_the_pool_reports_its_size_what_is_leased_and_who_holds_it(world: World) -> None:
    world.alice.enrol()
    world.alice.enrol()
    world.alice.connect()
    world.other_alice.connect()
    assert world.target.pool() == {
        "pool": POOL, "pool6": None, "size": 6, "leased": 4, "free": 2, "devices_per_user": QUOTA,
        "tunnels_per_user": TUNNELS,
        "holders": [{"host": "hq", "user_id": "alice", "devices": 2, "tunnels": 1},
                    {"host": "branch", "user_id": "alice", "devices": 0, "tunnels": 1}]}


# ------------------------------------------------------------------ users scoped by their Host


def test_another_hosts_alice_cannot_see_end_or_revoke_alices_tickets(world: World) -> None:
    device, tunnel = world.alice.enrol(), world.alice.connect()
    for ticket in (device, tunnel):
        with pytest.raises(AgentRejected) as seen:
            world.other_alice.status(ticket)
        assert seen.value.reason.startswith("target rejected: ticket unknown or not this user's")
        with pytest.raises(AgentRejected) as ended:
            world.other_alice.disconnect(ticket)
        assert ended.value.reason.startswith("target rejected: ticket unknown, not this user's")
        assert world.session(ticket)[0] == "active"
    assert agent_conn_name(device) in world.charon.conns
    assert world.alice.status(device) == "active"  # her own Host's alice still can


def test_another_hosts_revocation_naming_alices_key_bars_only_its_own_user(world: World) -> None:
    """branch revokes its own alice, then sends a revocation of "alice" naming hq's alice's public
    key (as a compromised branch could): Target records both as branch's, which bar branch's user
    only; hq's alice keeps her device and her access."""
    device = world.alice.enrol()
    branch = world.hosts["branch"]
    assert branch.revoke("alice")["targets"] == {"far": "confirmed: 0 tunnels closed"}
    forged = Revocation(host="branch", target="far", nonce=b"\x07" * 16, timestamp=int(world.clock()),
                        user_id="alice", sign_public_key=ALICE.public.sign)
    answer = world.target.revoke(branch.keys.seal(kind=Kind.REVOKE, to="far", body=forged.body(),
                                                  recipient=FAR.public.kem)).answer
    assert answer == b"0"  # none of branch's sessions: alice of hq is not branch's
    assert world.session(device)[0] == "active"
    assert world.alice.status(device) == "active"  # not locked out of any later request
    assert world.session(world.alice.connect())[0] == "active"
    with world.target_store.unit() as uow:
        assert {(r.host_id, r.user_id) for r in uow.revocations.all()} == {("branch", "alice")}
        assert len(uow.revocations.all()) == 2  # branch's alice's own key, and the key it named


def test_a_hosts_revocation_ends_and_bars_its_own_user(world: World) -> None:
    device, others = world.alice.enrol(), world.other_alice.enrol()
    result = world.hosts["hq"].revoke("alice")
    assert result["targets"] == {"far": "confirmed: 1 tunnels closed"}
    assert world.session(device)[0] == AgentSessionState.REVOKED.value
    assert world.session(others)[0] == "active"


# ------------------------------------------------------------------ revocations that get through


def test_a_revocation_far_did_not_get_is_kept_and_sent_again_until_confirmed(world: World) -> None:
    hq = world.hosts["hq"]
    device, tunnel = world.alice.enrol(), world.alice.connect()
    world.far_up = False
    result = hq.revoke("alice")
    assert result["targets"]["far"].startswith("not confirmed: agent peer unreachable")
    [pending] = hq.revocations.pending("alice")
    assert (pending.target_id, pending.attempts, pending.sign_public_key) == ("far", 1, ALICE.public.sign)
    [listed] = [u for u in hq.users() if u["user_id"] == "alice"]
    assert listed["unconfirmed"]["far"]["attempts"] == 1
    assert listed["unconfirmed"]["far"]["last_error"].startswith("agent peer unreachable")
    assert world.session(device)[0] == world.session(tunnel)[0] == "active"  # far has not heard
    # Not due yet: nothing is sent.
    sent = len(world.posted)
    assert hq.retry_revocations() == []
    assert len(world.posted) == sent
    # Due, far still down: sent again, put off for twice as long.
    world.clock.now += RETRY_FIRST
    assert hq.retry_revocations() == []
    assert len(world.posted) == sent + 1
    [pending] = hq.revocations.pending("alice")
    assert pending.attempts == 2
    assert pending.next_attempt_at.timestamp() == world.clock.now + 2 * RETRY_FIRST
    # far is back: the next attempt is confirmed, alice's sessions end, nothing is kept.
    world.far_up = True
    world.clock.now += 2 * RETRY_FIRST
    assert hq.retry_revocations() == ["alice@far"]
    assert hq.revocations.pending("alice") == []
    assert [u["unconfirmed"] for u in hq.users() if u["user_id"] == "alice"] == [{}]
    assert world.session(device)[0] == world.session(tunnel)[0] == AgentSessionState.REVOKED.value
    assert agent_conn_name(device) not in world.charon.conns
    assert hq.retry_revocations() == []
    assert world.posted[-1] == "http://far:8000/v1/agent/target/revocations"


def test_the_user_revokes_her_own_device_while_the_revocation_is_pending(world: World) -> None:
    hq = world.hosts["hq"]
    device = world.alice.enrol()
    world.far_up = False
    hq.revoke("alice")
    world.far_up = True
    assert world.alice.disconnect(device) is Kind.CLOSED  # Host lets it through: it only takes access away
    assert world.session(device)[0] == AgentSessionState.REVOKED.value
    with pytest.raises(AgentRejected) as info:
        world.alice.connect()  # never anything that gives access
    assert info.value.reason == "revoked user alice"
    world.clock.now += RETRY_FIRST
    assert hq.retry_revocations() == ["alice@far"]
    with pytest.raises(AgentRejected) as info:
        world.alice.disconnect(device)  # confirmed: nothing is pending, Host refuses her as revoked
    assert info.value.reason == "revoked user alice"


def test_a_target_that_fails_is_tried_once_a_round_however_many_revocations_wait(world: World) -> None:
    hq = world.hosts["hq"]
    world.far_up = False
    hq.revoke("alice")
    hq.revoke("bob")
    sent = len(world.posted)
    world.clock.now += RETRY_FIRST
    assert hq.retry_revocations() == []
    assert len(world.posted) == sent + 1  # bob's waits for its next attempt
    world.far_up = True
    world.clock.now += RETRY_MAX
    assert sorted(hq.retry_revocations()) == ["alice@far", "bob@far"]


def test_the_backoff_doubles_up_to_its_bound() -> None:
    assert [retry_delay(n) for n in (1, 2, 3)] == [RETRY_FIRST, 2 * RETRY_FIRST, 4 * RETRY_FIRST]
    assert retry_delay(10) == retry_delay(10_000) == RETRY_MAX
