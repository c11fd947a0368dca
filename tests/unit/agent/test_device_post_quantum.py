"""Post-quantum protection for devices: which platforms' clients can take a PPK (and why the others
cannot), the PPK in Apple's and swanctl's profiles (reading back as written, mandatory), a PPK
refused for a platform without one, and the post-quantum minimum in a client's request."""

from __future__ import annotations

import base64
import plistlib
import secrets

import pytest

from app.adapters.agent.profiles import Inexpressible, parse_swanctl, write_profile
from app.adapters.vici.commands import ENTRIES
from app.domain.agent import AgentRejected, Kind, Response, TunnelingInfo, b64e
from app.domain.agent.parts import RequestInfo
from app.domain.agent.platforms import LABELS, PLATFORMS, post_quantum_refusal
from app.domain.charon_port import LoadShared
from app.domain.errors import InvalidInput, PlatformCannot
from tests.unit.agent.test_device_profiles import Credentials, apple_payloads, creds, make_input

__all__ = ["creds"]  # the module-scoped fixture, shared with the profile tests

PPK = bytes(range(32))
PPK_ID = "qoss-ppk-0a1b2c3d4e5f6a7b"


def test_apple_and_swanctl_take_a_ppk_and_the_others_nothing() -> None:
    assert {name: p.post_quantum for name, p in PLATFORMS.items()} == {
        "android": (), "apple": ("ppk",), "windows": (), "networkmanager": (), "swanctl": ("ppk",)}
    assert "iOS 18" in PLATFORMS["apple"].post_quantum_note
    assert "macOS 15" in PLATFORMS["apple"].post_quantum_note
    assert "charon-cmd has no PPK option" in PLATFORMS["swanctl"].post_quantum_note


@pytest.mark.parametrize("platform", ["android", "windows", "networkmanager"])
def test_a_platform_without_post_quantum_is_refused_naming_it_and_why(platform: str) -> None:
    why = post_quantum_refusal(platform, 5)
    assert why is not None
    assert why.startswith(f"{LABELS[platform]} ({platform}): no post-quantum protection at level 5: ")
    assert "no post-quantum setting" in why


def test_android_refusal_says_the_app_has_no_setting() -> None:
    assert "the strongSwan app has no post-quantum setting" in (post_quantum_refusal("android", 1) or "")


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_no_minimum_refuses_no_platform(platform: str) -> None:
    assert post_quantum_refusal(platform, 0) is None


@pytest.mark.parametrize("platform", ["apple", "swanctl"])
def test_a_platform_with_a_ppk_meets_a_minimum(platform: str) -> None:
    assert post_quantum_refusal(platform, 10) is None


@pytest.mark.parametrize(("platform", "level"), [("blackberry", 1), ("apple", 11), ("apple", -1), ("apple", True)])
def test_an_unknown_platform_or_level_is_invalid(platform: str, level: int) -> None:
    with pytest.raises(InvalidInput):
        post_quantum_refusal(platform, level)


# --------------------------------------------------------------------------- profiles


def test_apple_profile_carries_the_ppk_its_id_and_makes_it_mandatory(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "apple", ppk=PPK, ppk_id=PPK_ID))
    ikev2 = apple_payloads(profile)["com.apple.vpn.managed"]["IKEv2"]
    assert (ikev2["PPK"], ikev2["PPKIdentifier"], ikev2["PPKMandatory"]) == (PPK, PPK_ID, 1)
    assert isinstance(plistlib.loads(profile.content)["PayloadContent"][2]["IKEv2"]["PPK"], bytes)  # <data>


def test_apple_profile_without_a_ppk_has_none_of_its_keys(creds: Credentials) -> None:
    ikev2 = apple_payloads(write_profile(make_input(creds, "apple")))["com.apple.vpn.managed"]["IKEv2"]
    assert not {"PPK", "PPKIdentifier", "PPKMandatory"} & set(ikev2)


def test_swanctl_profile_requires_the_ppk_and_holds_it_as_a_secret(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "swanctl", ppk=PPK, ppk_id=PPK_ID))
    text = profile.content.decode("utf-8")
    conf = parse_swanctl(text)
    conn = conf["connections"]["qoss-target-1"]  # type: ignore[index]
    assert (conn["ppk_id"], conn["ppk_required"]) == (PPK_ID, "yes")
    assert conf["secrets"] == {"ppk-qoss-target-1": {"id": PPK_ID, "secret": "0s" + base64.b64encode(PPK).decode()}}
    assert "charon-cmd has no PPK option" in text
    assert "--ike-proposal" not in text  # no charon-cmd line that would join without the PPK


def test_swanctl_profile_without_a_ppk_has_no_secrets(creds: Credentials) -> None:
    conf = parse_swanctl(write_profile(make_input(creds, "swanctl")).content.decode("utf-8"))
    assert "secrets" not in conf
    assert "ppk_id" not in conf["connections"]["qoss-target-1"]  # type: ignore[operator]


@pytest.mark.parametrize("platform", ["android", "windows", "networkmanager"])
def test_a_ppk_for_a_platform_without_one_writes_nothing(creds: Credentials, platform: str) -> None:
    with pytest.raises(Inexpressible) as refused:
        write_profile(make_input(creds, platform, ppk=PPK, ppk_id=PPK_ID))
    assert isinstance(refused.value, PlatformCannot)
    assert LABELS[platform] in str(refused.value)
    assert "post-quantum" in str(refused.value)


@pytest.mark.parametrize(("ppk", "ppk_id", "field"), [
    (PPK, None, "both or neither"), (None, PPK_ID, "both or neither"), (b"short", PPK_ID, "ppk:"),
    (bytes(257), PPK_ID, "ppk:"), (PPK, "bad id", "ppk_id"), (PPK, "x" * 65, "ppk_id"),
    (PPK, 'a"b', "ppk_id"), (PPK, "", "ppk_id")])
def test_a_malformed_ppk_or_id_is_refused_naming_it(creds: Credentials, ppk: bytes | None, ppk_id: str | None,
                                                    field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        write_profile(make_input(creds, "swanctl", ppk=ppk, ppk_id=ppk_id))


def test_the_ppk_is_never_in_a_repr(creds: Credentials) -> None:
    ppk = secrets.token_bytes(32)
    inp = make_input(creds, "apple", ppk=ppk, ppk_id=PPK_ID)
    assert ppk.hex() not in repr(inp)
    assert repr(ppk) not in repr(inp)


# --------------------------------------------------------------------------- the request


def _info(levels: dict[str, object]) -> dict[str, object]:
    return {"target": "target-1", "min_levels": levels, "supports": [], "ah": False, "transport": False,
            "lifetime": 600, "platform": "apple"}


def test_a_request_carries_a_post_quantum_minimum() -> None:
    info = RequestInfo(target="target-1", min_levels={"post_quantum": 5, "integrity": 3}, platform="apple")
    assert RequestInfo.from_dict(info.as_dict()).min_levels == {"post_quantum": 5, "integrity": 3}


@pytest.mark.parametrize("value", [11, -1, "5", True])
def test_a_post_quantum_minimum_out_of_range_is_rejected(value: object) -> None:
    with pytest.raises(AgentRejected):
        RequestInfo.from_dict(_info({"post_quantum": value}))


# --------------------------------------------------------------------------- charon's load


def test_a_ppk_goes_to_charon_as_a_shared_secret_of_type_ppk_owned_by_its_id() -> None:
    command = ENTRIES[LoadShared].command(LoadShared("qoss-agent-0a1b", PPK, (PPK_ID,), "PPK"))
    assert (command.name, dict(command.message or {})) == (
        "load-shared", {"id": "qoss-agent-0a1b", "type": "PPK", "data": PPK, "owners": [PPK_ID]})
    assert PPK not in repr(LoadShared("qoss-agent-0a1b", PPK, (PPK_ID,), "PPK")).encode()
    ike = ENTRIES[LoadShared].command(LoadShared("qoss-t1", PPK, ("left", "right")))
    assert (ike.message or {})["type"] == "IKE"


# --------------------------------------------------------------------------- a client's tunnel


def _tunnel(ppk_id: str | None) -> TunnelingInfo:
    return TunnelingInfo(ticket="a" * 32, protection="esp", target_address="10.0.0.1", target_identity="t",
                         client_identity="c", remote_ts=("10.2.0.1/32",), ike_proposal="aes128-sha256-x25519",
                         esp_proposal="aes128gcm16", mode="tunnel", suite={"post_quantum": "ppk"}, notes=(),
                         expires=1, ppk_id=ppk_id)


def _response(ppk_id: str | None, ppk: bytes | None) -> Response:
    return Response(kind=Kind.RESPONSE, request_id=b"\x01" * 16, session_key=b"\x42" * 32,
                    tunneling_info=_tunnel(ppk_id), target="t", user_id="alice", host="h", timestamp=1, ppk=ppk)


def test_a_response_carries_a_clients_ppk_with_its_id_and_never_shows_it() -> None:
    response = _response(PPK_ID, PPK)
    parsed = Response.parse(response.body(), kind=Kind.RESPONSE)
    assert parsed.ppk == PPK
    assert parsed.tunneling_info is not None
    assert parsed.tunneling_info.ppk_id == PPK_ID
    assert PPK.hex() not in repr(response)
    assert b64e(PPK) not in repr(response)
    assert Response.parse(_response(None, None).body(), kind=Kind.RESPONSE).ppk is None


@pytest.mark.parametrize(("ppk_id", "ppk"), [(PPK_ID, None), (None, PPK)])
def test_a_ppk_without_its_id_or_an_id_without_its_ppk_is_rejected(ppk_id: str | None, ppk: bytes | None) -> None:
    with pytest.raises(AgentRejected) as rejected:
        Response.parse(_response(ppk_id, ppk).body(), kind=Kind.RESPONSE)
    assert "PPK" in rejected.value.reason


def test_a_ppk_id_that_cannot_be_a_conns_is_rejected() -> None:
    with pytest.raises(AgentRejected):
        Response.parse(_response("bad id\n", PPK).body(), kind=Kind.RESPONSE)
