"""A user's own devices and the administrator's view of them, on the fakes (no database, no
charon): the user asks every device enrolment of theirs with its state (active, stale with the
reason, revoked, expired) through Host, signed by their key and answered sealed to them; they
revoke one; another user can neither list nor revoke them; a replayed list is refused. Host asks
a Target for a user's devices and revokes one for the administrator, locally and over the wire.
The same against the lab's real charons and a stock client: ``tests/integration/agent/test_my_devices.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.domain.agent import AgentRejected, Kind, RequestInfo, Response, agent_conn_name
from app.domain.agent.messages import UserDeviceList, UserDevices
from app.domain.agent.parts import DeviceInfo, DeviceState
from app.domain.errors import InvalidInput, NotFound
from app.services import policies
from app.services.agent.client import AgentClient
from app.services.agent.config import AgentConfig, HostRole, Party
from app.services.agent.host import HostAgent
from tests.fakes.uow import FakeDatabase
from tests.unit.services.test_agent_roles import SERVER, Roles
from tests.unit.services.test_agent_roles import device_roles as roles
from tests.unit.services.test_agent_trust import FAR, HQ, World, world

__all__ = ["roles", "world"]  # the roles whose Target enrols devices; the two Hosts and one Target of test_agent_trust

BOB = KeyPair.generate("bob")


def client_of(roles: Roles, user: str, keys: KeyPair) -> AgentClient:
    """Another user of the same Host, enrolled with their own keys."""
    roles.host.enroll(user_id=user, objectives=[3], **keys.public.as_dict())
    return roles.client_of(user, keys, state=f"state-{user}")


def enrol(roles: Roles, platform: str, client: AgentClient | None = None) -> str:
    client = client or roles.client
    request, wire = client.request(Kind.CONNECT, RequestInfo(target="hq", platform=platform), 3)
    info = client.accept(roles.host.handle(wire).answer, request).tunneling_info
    assert info is not None
    return info.ticket


def my_devices(roles: Roles, client: AgentClient | None = None, objective_id: int = 3) -> dict[str, DeviceInfo]:
    """What Target says of the user's devices when they ask (through Host, signed and sealed)."""
    client = client or roles.client
    request, wire = client.request(Kind.DEVICES, RequestInfo(target="hq"), objective_id)
    answer = client.accept(roles.host.handle(wire).answer, request)
    assert answer.kind is Kind.DEVICE_LIST
    assert answer.devices is not None
    return {d.ticket: d for d in answer.devices}


def revoke(roles: Roles, ticket: str, client: AgentClient | None = None) -> Kind:
    client = client or roles.client
    request, wire = client.request(Kind.DISCONNECT, RequestInfo(target="hq", ticket=ticket), 3)
    return client.accept(roles.host.handle(wire).answer, request).kind


def test_the_user_lists_their_devices_with_their_states_and_revokes_one(roles: Roles) -> None:
    phone, laptop = enrol(roles, "android"), enrol(roles, "networkmanager")
    roles.connect()  # a tunnel of the user's own client: not a device
    listed = my_devices(roles)
    assert set(listed) == {phone, laptop}
    assert listed[phone].state is DeviceState.ACTIVE
    assert (listed[phone].platform, listed[phone].objective_id, listed[phone].ended) == ("android", 3, None)
    assert listed[phone].expires > listed[phone].created

    assert revoke(roles, phone) is Kind.CLOSED
    assert agent_conn_name(phone) not in roles.charon.conns  # the conn that took only its certificate
    after = my_devices(roles)
    assert (after[phone].state, after[phone].reason) == (DeviceState.REVOKED, "device revoked by its user")
    assert after[phone].ended is not None
    assert after[laptop].state is DeviceState.ACTIVE


def test_an_expired_device_and_a_stale_one_say_so(roles: Roles, database: FakeDatabase) -> None:
    stale = enrol(roles, "android")
    follower = roles.target.follower()
    follower.follow()
    with roles.store.unit() as uow:
        session = uow.sessions.get(stale)
    assert session is not None
    esp = str(session.suite["proposals"]["esp"]).split("-")[0]
    with database.unit() as uow:
        current, revision = policies.get_policy(uow=uow, name="platform-android")
        policies.replace_policy(uow=uow, name="platform-android", document={**current.as_dict(), "deny": [esp]},
                                expected_revision=revision, author="test")
        uow.commit()
    assert follower.follow() == [stale]
    expired = enrol(roles, "apple")
    with roles.store.unit() as uow:
        session = uow.sessions.get(expired)
    assert session is not None
    roles.clock.now = session.expires_at.timestamp() + 1
    assert roles.target.sweep() == [expired]
    listed = my_devices(roles)
    assert listed[stale].state is DeviceState.STALE
    assert listed[stale].reason.endswith("its profile is stale: enrol the device again")
    assert listed[expired].state is DeviceState.EXPIRED


def test_another_user_neither_sees_nor_revokes_my_devices(roles: Roles, tmp_path: Path) -> None:
    mine = enrol(roles, "android")
    bob = client_of(roles, "bob", BOB)
    theirs = enrol(roles, "apple", bob)
    assert set(my_devices(roles, bob)) == {theirs}
    with pytest.raises(AgentRejected) as refused:
        revoke(roles, mine, bob)  # bob's own signed request, for my ticket
    assert "not this user's" in refused.value.reason
    assert my_devices(roles)[mine].state is DeviceState.ACTIVE
    assert agent_conn_name(mine) in roles.charon.conns
    # bob signing a request that names me: Host checks it against my key and refuses it.
    request, _ = bob.request(Kind.DEVICES, RequestInfo(target="hq"), 3)
    forged = BOB.seal(kind=Kind.DEVICES, to="hq",
                      body=request.__class__(**{**{f: getattr(request, f) for f in request.__dataclass_fields__},
                                                "user_id": "alice"}).body(),
                      recipient=SERVER.public.kem)
    with pytest.raises(AgentRejected):
        roles.host.handle(forged)


def test_a_replayed_list_is_refused(roles: Roles) -> None:
    enrol(roles, "android")
    request, wire = roles.client.request(Kind.DEVICES, RequestInfo(target="hq"), 3)
    roles.client.accept(roles.host.handle(wire).answer, request)
    with pytest.raises(AgentRejected) as refused:
        roles.host.handle(wire)
    assert refused.value.reason == "replayed request"


def test_a_list_names_no_platform_and_answers_only_with_devices() -> None:
    from app.domain.agent import ClientRequest

    with_platform = ClientRequest(kind=Kind.DEVICES, request_id=b"\0" * 16, user_id="alice", objective_id=3,
                                  request_info=RequestInfo(target="hq", platform="android"), host="hq", timestamp=1)
    with pytest.raises(AgentRejected):
        ClientRequest.parse(with_platform.body(), kind=Kind.DEVICES)
    bare = Response(kind=Kind.DEVICE_LIST, request_id=b"\1" * 16, session_key=None, tunneling_info=None,
                    target="hq", user_id="alice", host="hq", timestamp=1)
    with pytest.raises(AgentRejected) as refused:
        Response.parse(bare.body(), kind=Kind.DEVICE_LIST)
    assert "a list of devices carries devices" in refused.value.reason
    device = DeviceInfo(ticket="a" * 32, platform="android", state=DeviceState.ACTIVE, reason="", objective_id=3,
                        created=1, expires=2, ended=None)
    listed = Response(kind=Kind.DEVICE_LIST, request_id=b"\1" * 16, session_key=None, tunneling_info=None,
                      target="hq", user_id="alice", host="hq", timestamp=1, devices=(device,))
    assert Response.parse(listed.body(), kind=Kind.DEVICE_LIST) == listed
    query = UserDevices(host="hq", target="far", nonce=b"\2" * 16, timestamp=5, user_id="alice", revoke="b" * 32)
    assert UserDevices.parse(query.body()) == query
    answer = UserDeviceList(target="far", host="hq", nonce=b"\2" * 16, timestamp=5, user_id="alice",
                            devices=(device,), revoked=None)
    assert UserDeviceList.parse(answer.body()) == answer


def test_the_administrator_lists_a_users_devices_and_revokes_one(roles: Roles, tmp_path: Path) -> None:
    phone, laptop = enrol(roles, "android"), enrol(roles, "apple")
    bob = client_of(roles, "bob", BOB)
    theirs = enrol(roles, "android", bob)
    listed = roles.host.user_devices("alice")
    assert [d["ticket"] for d in listed["devices"]] == [laptop, phone] or {
        d["ticket"] for d in listed["devices"]} == {phone, laptop}
    assert {d["target"] for d in listed["devices"]} == {"hq"}
    assert listed["unanswered"] == {}
    assert roles.host.revoke_device(user_id="alice", ticket=phone) == {
        "user_id": "alice", "ticket": phone, "target": "hq", "revoked": True}
    assert agent_conn_name(phone) not in roles.charon.conns
    after = {d["ticket"]: d for d in roles.host.user_devices("alice")["devices"]}
    assert (after[phone]["state"], after[phone]["reason"]) == ("revoked", "device revoked by an administrator")
    with pytest.raises(NotFound):
        roles.host.revoke_device(user_id="alice", ticket=phone)  # revoked already
    with pytest.raises(NotFound):
        roles.host.revoke_device(user_id="alice", ticket=theirs)  # bob's, not alice's
    assert my_devices(roles, bob)[theirs].state is DeviceState.ACTIVE
    with pytest.raises(NotFound):
        roles.host.user_devices("nobody")


def test_host_asks_a_remote_target_signed_and_sealed_and_a_replay_is_refused(roles: Roles) -> None:
    phone = enrol(roles, "android")
    posted: list[tuple[str, bytes]] = []

    def post(url: str, wire: bytes) -> bytes:
        posted.append((url, wire))
        return roles.target.handle(wire).answer

    config = AgentConfig(id="hq", key_dir=roles.client.config.key_dir,
                         host=HostRole(targets={"hq": Party(url="http://target.invalid", **SERVER.public.as_dict())}))
    remote = HostAgent(config=config, keys=SERVER, crypto=CRYPTO, store=roles.store, post=post, clock=roles.clock)
    listed = remote.user_devices("alice")
    assert [d["ticket"] for d in listed["devices"]] == [phone]
    assert posted[0][0] == "http://target.invalid/v1/agent/target/requests"
    with pytest.raises(AgentRejected) as refused:
        roles.target.handle(posted[0][1])
    assert refused.value.reason == "replayed question"
    assert remote.revoke_device(user_id="alice", ticket=phone)["revoked"] is True
    assert agent_conn_name(phone) not in roles.charon.conns


def test_another_hosts_user_of_the_same_id_and_an_untrusted_host_get_nothing(world: World) -> None:
    """Two Hosts trusted by one Target each have an ``alice``: neither sees nor revokes the other's
    devices, by her own request or by her Host's question; a Host the Target does not trust, or one
    that signs a question as another, is refused."""
    device = world.alice.enrol()
    theirs = world.other_alice.send(Kind.DEVICES, RequestInfo(target="far")).devices
    assert theirs == ()
    mine = world.alice.send(Kind.DEVICES, RequestInfo(target="far")).devices
    assert mine is not None
    assert [(d.ticket, d.state) for d in mine] == [(device, DeviceState.ACTIVE)]
    branch = world.hosts["branch"]
    assert branch.user_devices("alice")["devices"] == []
    with pytest.raises(NotFound):
        branch.revoke_device(user_id="alice", ticket=device)
    for signer, sender in ((KeyPair.generate("stranger"), "stranger"), (HQ, "branch")):
        question = UserDevices(host=sender, target="far", nonce=signer.public.sign[:16],
                               timestamp=int(world.clock()), user_id="alice", revoke=device)
        with pytest.raises(AgentRejected):
            world.target.handle(signer.seal(kind=Kind.USER_DEVICES, to="far", body=question.body(),
                                            recipient=FAR.public.kem))
    assert world.session(device)[0] == "active"
    assert world.alice.status(device) == "active"


def test_the_command_line_lists_and_revokes_a_device_enrolled_elsewhere(roles: Roles) -> None:
    """``qoss agent device list --everywhere`` and ``device revoke`` for a device this machine has
    no record of (the phone that joined from its own page)."""
    phone = enrol(roles, "android")  # not through this machine's enrol_device: no record here
    cli = AgentClient(config=roles.client.config, keys=roles.client.keys, crypto=CRYPTO, vici=roles.client.vici,
                      post=lambda url, wire: roles.host.handle(wire).answer, clock=roles.clock)
    assert cli.devices() == []
    listed = cli.devices_everywhere()
    assert [(d["ticket"], d["target"], d["platform"], d["state"]) for d in listed] == [
        (phone, "hq", "android", "active")]
    assert cli.revoke_device(phone) == {"ticket": phone, "platform": "android", "revoked": True}
    assert agent_conn_name(phone) not in roles.charon.conns
    assert [d["state"] for d in cli.devices_everywhere()] == ["revoked"]
    with pytest.raises(InvalidInput, match="no active device"):
        cli.revoke_device(phone)
    with pytest.raises(InvalidInput, match="not a device's ticket"):
        cli.revoke_device("../devices/x")
