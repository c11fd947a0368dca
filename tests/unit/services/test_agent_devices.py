"""Devices on the fakes (no database, no charon): an enrolment through Host gives a profile and a
one-time passphrase, and loads into Target's charon the CA, the gateway's key and a conn that takes
only that device's certificate with the negotiated proposals; a platform that cannot meet the
minimums is refused by name with nothing loaded; revoking ends it; a charon restart loads it
again; a platform-table edit that leaves its suite below the minimums closes it as stale.
The same against real charons and the stock client: ``tests/integration/agent/test_device_join.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.domain.agent import (
    AgentRejected,
    AgentSessionState,
    ClientRequest,
    Kind,
    RequestInfo,
    Response,
    SessionStatus,
    agent_conn_name,
)
from app.domain.errors import InvalidInput, PlatformCannot
from app.services import policies
from tests.fakes.uow import FakeDatabase
from tests.fixtures.handoff import link_parts, open_sealed_profile
from tests.unit.services.test_agent_roles import Roles, enrol_device
from tests.unit.services.test_agent_roles import device_roles as roles

__all__ = ["roles"]  # the roles whose Target enrols devices, shared


def test_an_enrolment_gives_a_profile_and_loads_a_conn_for_that_certificate_only(roles: Roles) -> None:
    response = enrol_device(roles, "android", confidentiality=8)
    device, info = response.device, response.tunneling_info
    assert device is not None
    assert info is not None
    assert response.session_key is None  # no PSK: the device proves itself with its certificate
    assert device.profile_name.endswith(".sswan")
    profile = json.loads(device.profile)
    assert (profile["ike-proposal"], profile["esp-proposal"]) == (info.ike_proposal, info.esp_proposal)
    assert device.passphrase not in device.profile.decode()
    conn = agent_conn_name(info.ticket)
    body = roles.charon.conns[conn]
    assert body["remote"]["auth"] == "pubkey"
    assert body["remote"]["id"] == f"CN={info.client_identity}" == profile["local"]["id"]
    assert body["proposals"] == [info.ike_proposal]
    assert body["children"][conn]["esp_proposals"] == [info.esp_proposal]
    assert roles.charon.shared == {}
    assert len(roles.charon.certs) == len(roles.charon.keys) == 1
    with roles.store.unit() as uow:
        session = uow.sessions.get(info.ticket)
    assert session is not None
    assert (session.platform, session.state) == ("android", "active")
    assert session.provenance is not None
    assert session.provenance["request"]["platform"] == "android"
    assert "platform_revision" in session.provenance
    assert roles.charon.pools == {conn: {"addrs": f"{session.virtual_ip}/32"}}


def test_a_platform_that_cannot_meet_the_minimums_is_refused_by_name_with_nothing_loaded(roles: Roles) -> None:
    # Of what this (fake) charon offers, Windows's client has no key exchange above modp2048 (level 6).
    with pytest.raises(PlatformCannot, match=r"Windows 10/11 built-in IKEv2: no .*key_exchange.* 8 .*: 6\)"):
        enrol_device(roles, "windows", key_exchange=8)
    assert not roles.charon.conns
    assert not roles.charon.pools
    assert not roles.charon.certs
    with roles.store.unit() as uow:
        assert uow.sessions.select() == []
    assert enrol_device(roles, "android", key_exchange=8).device is not None  # strongSwan's app can (x25519)


@pytest.mark.parametrize(("platform", "why"), [("symbian", "unknown platform"), ("apple", None)])
def test_an_unknown_platform_is_refused_and_a_known_one_served(roles: Roles, platform: str, why: str | None) -> None:
    if why is None:
        assert enrol_device(roles, platform).device is not None
        return
    with pytest.raises(InvalidInput, match=why):
        enrol_device(roles, platform)
    assert not roles.charon.conns


def test_revoking_a_device_ends_it_and_unloads_its_conn(roles: Roles) -> None:
    info = enrol_device(roles, "android").tunneling_info
    assert info is not None
    assert roles.disconnect(info.ticket) is Kind.CLOSED
    with roles.store.unit() as uow:
        session = uow.sessions.get(info.ticket)
    assert session is not None
    assert (session.state, session.reason) == ("revoked", "device revoked by its user")
    assert not roles.charon.conns
    assert not roles.charon.pools


def test_a_charon_restart_loads_the_device_again(roles: Roles) -> None:
    info = enrol_device(roles, "android").tunneling_info
    assert info is not None
    conn = agent_conn_name(info.ticket)
    before = dict(roles.charon.conns[conn])
    roles.restart_charon()
    assert roles.target.reconcile().vanished == []
    assert roles.charon.conns[conn] == before
    assert conn in roles.charon.pools
    with roles.store.unit() as uow:
        session = uow.sessions.get(info.ticket)
    assert session is not None
    assert session.state == "active"


def test_a_platform_table_edit_below_the_minimums_makes_the_profile_stale(roles: Roles,
                                                                          database: FakeDatabase) -> None:
    info = enrol_device(roles, "android", confidentiality=8).tunneling_info
    assert info is not None
    esp = str(info.esp_proposal).split("-")[0]
    follower = roles.target.follower()
    follower.follow()  # notes where the event log is
    with database.unit() as uow:
        current, revision = policies.get_policy(uow=uow, name="platform-android")
        policies.replace_policy(uow=uow, name="platform-android", document={**current.as_dict(), "deny": [esp]},
                                expected_revision=revision, author="test")
        uow.commit()
    assert follower.follow() == [info.ticket]
    with roles.store.unit() as uow:
        session = uow.sessions.get(info.ticket)
    assert session is not None
    assert session.state == AgentSessionState.CLOSED.value
    assert "policy platform-android revision 2" in session.reason
    assert session.reason.endswith("its profile is stale: enrol the device again")
    assert agent_conn_name(info.ticket) not in roles.charon.conns


def status(roles: Roles, ticket: str) -> SessionStatus:
    """What Target says of ``ticket`` when alice asks (through Host, signed and sealed as any request)."""
    request, wire = roles.client.request(Kind.STATUS, RequestInfo(target="hq", ticket=ticket), 3)
    answer = roles.client.accept(roles.host.handle(wire).answer, request)
    assert answer.kind is Kind.STATE
    assert answer.status is not None
    return answer.status


def test_the_user_asks_what_became_of_a_device_and_learns_its_profile_is_stale(
        roles: Roles, database: FakeDatabase) -> None:
    info = enrol_device(roles, "android", confidentiality=8).tunneling_info
    assert info is not None
    assert status(roles, info.ticket) == SessionStatus(info.ticket, AgentSessionState.ACTIVE, "", "android")
    esp = str(info.esp_proposal).split("-")[0]
    follower = roles.target.follower()
    follower.follow()
    with database.unit() as uow:
        current, revision = policies.get_policy(uow=uow, name="platform-android")
        policies.replace_policy(uow=uow, name="platform-android", document={**current.as_dict(), "deny": [esp]},
                                expected_revision=revision, author="test")
        uow.commit()
    assert follower.follow() == [info.ticket]
    stale = status(roles, info.ticket)
    assert stale.state is AgentSessionState.CLOSED
    assert stale.reason.endswith("its profile is stale: enrol the device again")
    assert status(roles, info.ticket) == stale  # asking again: a new request, the same answer


def test_a_revoked_device_says_so_and_a_ticket_of_no_one_is_refused(roles: Roles) -> None:
    info = enrol_device(roles, "apple").tunneling_info
    assert info is not None
    assert roles.disconnect(info.ticket) is Kind.CLOSED
    assert status(roles, info.ticket) == SessionStatus(info.ticket, AgentSessionState.REVOKED,
                                                       "device revoked by its user", "apple")
    with pytest.raises(AgentRejected) as refused:
        status(roles, "0" * 32)
    assert "ticket unknown" in refused.value.reason


def test_a_status_answer_carries_a_status_and_nothing_else_does() -> None:
    no_ticket = ClientRequest(kind=Kind.STATUS, request_id=b"\0" * 16, user_id="alice", objective_id=3,
                              request_info=RequestInfo(target="hq"), host="host-1", timestamp=1)
    with pytest.raises(AgentRejected) as refused:
        ClientRequest.parse(no_ticket.body(), kind=Kind.STATUS)
    assert "a disconnect or a status query names a ticket" in refused.value.reason
    state = Response(kind=Kind.STATE, request_id=b"\1" * 16, session_key=None, tunneling_info=None, target="hq",
                     user_id="alice", host="host-1", timestamp=1,
                     status=SessionStatus("t" * 32, AgentSessionState.ACTIVE, "", None))
    assert Response.parse(state.body(), kind=Kind.STATE) == state
    bare = Response(kind=Kind.STATE, request_id=b"\1" * 16, session_key=None, tunneling_info=None, target="hq",
                    user_id="alice", host="host-1", timestamp=1)
    with pytest.raises(AgentRejected) as refused:
        Response.parse(bare.body(), kind=Kind.STATE)
    assert "a state answer carries a status" in refused.value.reason


def test_a_profile_handed_off_is_fetched_once_before_it_expires(roles: Roles, tmp_path: Path) -> None:
    posted: list[bytes] = []

    def post(url: str, wire: bytes) -> bytes:
        if url.endswith("/v1/agent/requests"):
            return roles.host.handle(wire).answer
        assert url.endswith("/v1/agent/handoffs")
        posted.append(wire)
        return roles.host.handoff(wire).answer

    roles.client._post = post
    report = roles.client.enrol_device(target="hq", objective_id=3, platform="apple", out_dir=tmp_path / "out")
    link = roles.client.handoff(report, ttl=60)
    token, key = link_parts(link)
    profile = Path(report["profile"]).read_bytes()
    waiting = roles.host.take_handoff(token)
    assert waiting is not None
    assert (waiting.user_id, waiting.profile_name, waiting.media_type) == (
        roles.client.config.user, Path(report["profile"]).name, "application/x-apple-aspen-config")
    for clear in (report["gateway"]["address"], "RemoteAddress", "PayloadContent"):
        assert clear.encode() not in waiting.profile  # Host keeps what it cannot read
    assert open_sealed_profile(key, waiting.profile) == profile  # with the link's key: whole
    assert roles.host.take_handoff(token) is None  # once
    with pytest.raises(AgentRejected):
        roles.host.handoff(posted[0])  # a replay
    later, _ = link_parts(roles.client.handoff(report, ttl=60))
    roles.clock.now += 61
    assert roles.host.take_handoff(later) is None  # expired
    with roles.store.unit() as uow:
        assert uow.handoffs.purge(datetime.fromtimestamp(roles.clock.now, UTC)) == 0  # the fetch removed it


def test_a_profile_with_files_beside_it_is_not_handed_off(roles: Roles, tmp_path: Path) -> None:
    roles.client._post = lambda url, wire: roles.host.handle(wire).answer
    report = roles.client.enrol_device(target="hq", objective_id=3, platform="windows", out_dir=tmp_path / "out")
    with pytest.raises(InvalidInput, match="files beside it"):
        roles.client.handoff(report)
