"""A device's enrolment on the wire: Target's answer carries the profile of every platform, its
files and the one-time passphrase, sealed to the client, and parses back unchanged; the passphrase
never shows in a repr; the answer's shape is checked (a device answer has no session key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.adapters.agent.crypto import KeyPair, open_sealed, seal
from app.adapters.agent.devices import LocalDeviceKit
from app.domain.agent import (
    AgentRejected,
    ClientRequest,
    DeviceBundle,
    Kind,
    RequestInfo,
    Response,
    TunnelingInfo,
    canonical,
)
from app.domain.agent.platforms import PLATFORMS
from app.domain.agent.ports import DeviceProfileRequest

TARGET = KeyPair.generate("target-1")
USER = KeyPair.generate("alice")
INFO = TunnelingInfo(ticket="a" * 32, protection="esp", target_address="10.99.0.3", target_identity="target-1",
                     client_identity="aaaaaaaaaaaa.alice.devices.invalid", remote_ts=("10.3.0.1/32",),
                     ike_proposal="aes256gcm16-prfsha384-ecp384", esp_proposal="aes256gcm16-ecp384", mode="tunnel",
                     suite={}, notes=(), expires=1)


def bundle(kit: LocalDeviceKit, platform: str) -> DeviceBundle:
    issued = kit.issue(INFO.client_identity, 7 * 86400, DeviceProfileRequest(
        platform=platform, name="qoss target-1", remote_address=INFO.target_address, remote_id=INFO.target_identity,
        local_id=kit.ike_identity(INFO.client_identity, platform), ike_proposal=str(INFO.ike_proposal),
        esp_proposal=str(INFO.esp_proposal), ike_lifetime=14400, child_lifetime=3600, remote_ts=INFO.remote_ts,
        domains=("corp.example",)))
    return DeviceBundle(platform=platform, profile_name=issued.profile_name, media_type=issued.media_type,
                        profile=issued.profile, files=issued.files, passphrase=issued.passphrase,
                        ca_cert=kit.ca_cert(), not_after=int(issued.not_after.timestamp()))


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> LocalDeviceKit:
    return LocalDeviceKit(Path(tmp_path_factory.mktemp("ca")), owner="target-1", gateway_addresses=["10.99.0.3"])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_platforms_answer_crosses_sealed_and_parses_back_unchanged(kit: LocalDeviceKit, platform: str) -> None:
    device = bundle(kit, platform)
    response = Response(kind=Kind.RESPONSE, request_id=b"\x01" * 16, session_key=None, tunneling_info=INFO,
                        target="target-1", user_id="alice", host="host-1", timestamp=1_800_000_000, device=device)
    wire = seal(kind=Kind.RESPONSE, to="alice", body=response.body(), signer=TARGET, recipient=USER.public.kem)
    kind, body, _ = open_sealed(wire, kinds=[Kind.RESPONSE], me=USER)
    parsed = Response.parse(body, kind=kind)
    assert parsed.device == device
    assert parsed.session_key is None
    assert device.passphrase not in repr(parsed)
    assert device.passphrase not in repr(device)


def test_a_device_answer_with_a_session_key_or_a_close_with_a_device_is_refused(kit: LocalDeviceKit) -> None:
    device = bundle(kit, "android")
    both = Response(kind=Kind.RESPONSE, request_id=b"\x01" * 16, session_key=b"\x02" * 32, tunneling_info=INFO,
                    target="t", user_id="alice", host="h", timestamp=1, device=device)
    with pytest.raises(AgentRejected):
        Response.parse(both.body(), kind=Kind.RESPONSE)
    fields = json.loads(both.body())
    fields.update(kind="closed", session_key=None, tunneling_info=None)
    with pytest.raises(AgentRejected):
        Response.parse(canonical(fields), kind=Kind.CLOSED)
    fields = json.loads(both.body())
    fields["device"]["files"] = {"../etc/passwd": fields["device"]["ca_cert"]}
    fields["session_key"] = None
    with pytest.raises(AgentRejected):
        Response.parse(canonical(fields), kind=Kind.RESPONSE)


def test_a_platform_rides_on_a_connect_only() -> None:
    connect = ClientRequest(kind=Kind.CONNECT, request_id=b"\x01" * 16, user_id="alice", objective_id=3,
                            request_info=RequestInfo(target="target-1", platform="android"), host="host-1",
                            timestamp=1_800_000_000)
    assert ClientRequest.parse(connect.body(), kind=Kind.CONNECT) == connect
    fields = json.loads(connect.body())
    fields["kind"] = "disconnect"
    fields["request_info"]["ticket"] = "b" * 32
    with pytest.raises(AgentRejected, match="rejected"):
        ClientRequest.parse(canonical(fields), kind=Kind.DISCONNECT)
    fields = json.loads(connect.body())
    fields["request_info"]["platform"] = "Android OS!"
    with pytest.raises(AgentRejected):
        ClientRequest.parse(canonical(fields), kind=Kind.CONNECT)
