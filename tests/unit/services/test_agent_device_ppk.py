"""Target and post-quantum devices, on the fakes (a fake charon that speaks VICI): an enrolment with a
post-quantum minimum gets a PPK that Target loads into its charon (a PPK secret, the conn requiring
it) and writes into the profile, keeps only sealed, and loads again after a charon restart; a
platform without a post-quantum setting is refused naming itself, with nothing loaded; an edit
raising the post-quantum minimum lists the devices whose platform cannot follow."""

from __future__ import annotations

import json
import logging
import plistlib
from pathlib import Path

import pytest

from app.adapters.agent.crypto import CRYPTO
from app.adapters.agent.devices import PPK_KEY_FILE, LocalDeviceKit
from app.adapters.agent.profiles import parse_swanctl
from app.domain.agent import Kind, RequestInfo, Response, agent_conn_name
from app.domain.agent.conns import client_conn, ppk_name
from app.domain.errors import PlatformCannot
from app.domain.tunnels import keywords_from_charon
from app.services import policies
from app.services.agent.client import AgentClient
from app.services.agent.target_edits import active_sessions, assess_sessions
from app.services.impact import preview
from tests.fakes.uow import FakeDatabase, FakeUnitOfWork
from tests.unit.services.test_agent_roles import ALICE, Roles, enrol_device, gateway
from tests.unit.services.test_agent_roles import device_roles as roles

__all__ = ["roles"]  # the roles whose Target enrols devices, shared

TABLE = "standards-2026"


def _require_post_quantum(uow: FakeUnitOfWork, policy: str, level: int) -> None:
    """An edit of the stored ``policy`` raising its post-quantum minimum to ``level`` (not committed)."""
    current, revision = policies.get_policy(uow=uow, name=policy)
    document = current.as_dict()
    document["min_levels"] = {**document.get("min_levels", {}), "post_quantum": level}
    policies.replace_policy(uow=uow, name=policy, document=document, expected_revision=revision, author="test")


def _ppk_secret(roles: Roles, conn: str) -> dict[str, object]:
    """The PPK secret Target loaded into its charon for ``conn``, as charon got it over VICI."""
    (loaded,) = [m for m in roles.charon.messages("load-shared") if m["id"] == conn]
    return _as_sent(loaded)


def _as_sent(loaded: dict[str, object]) -> dict[str, object]:
    """A load-shared message with its secret as the bytes sent (the fake decodes them as text,
    undecodable bytes as surrogates)."""
    data = loaded["data"]
    return {**loaded, "data": data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data}


def test_an_apple_enrolment_with_a_post_quantum_minimum_carries_the_ppk_target_loaded(
        roles: Roles, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    response = enrol_device(roles, "apple", post_quantum=5)
    device, info = response.device, response.tunneling_info
    assert device is not None
    assert info is not None
    assert info.suite["post_quantum"] == "ppk"
    ikev2 = plistlib.loads(device.profile)["PayloadContent"][2]["IKEv2"]
    conn = agent_conn_name(info.ticket)
    loaded = _ppk_secret(roles, conn)
    assert (loaded["type"], loaded["owners"], loaded["data"]) == ("PPK", [ikev2["PPKIdentifier"]], ikev2["PPK"])
    assert len(ikev2["PPK"]) == 32
    assert ikev2["PPKMandatory"] == 1
    body = roles.charon.conns[conn]
    assert (body["ppk_id"], body["ppk_required"]) == (ikev2["PPKIdentifier"], "yes")
    # Kept sealed: the record names the PPK's id; the key is nowhere in it, in a listing or a log.
    with roles.store.unit() as uow:
        session = uow.sessions.get(info.ticket)
    assert session is not None
    kept = json.dumps(session.suite)
    for form in (ikev2["PPK"].hex(), ikev2["PPK"].decode("latin-1")):
        assert form not in kept
        assert form not in caplog.text
    assert session.suite["ppk"]["id"] == ikev2["PPKIdentifier"]
    (listed,) = [s for s in roles.target.sessions() if s["ticket"] == info.ticket]
    assert listed["suite"]["ppk"] == {"id": ikev2["PPKIdentifier"]}


def test_two_devices_get_two_ppks(roles: Roles) -> None:
    first, second = (enrol_device(roles, "apple", post_quantum=3).device for _ in range(2))
    assert first is not None
    assert second is not None
    a, b = (plistlib.loads(d.profile)["PayloadContent"][2]["IKEv2"] for d in (first, second))
    assert a["PPK"] != b["PPK"]
    assert a["PPKIdentifier"] != b["PPKIdentifier"]


def test_a_swanctl_enrolment_requires_the_ppk_in_its_conf(roles: Roles) -> None:
    response = enrol_device(roles, "swanctl", post_quantum=5)
    assert response.device is not None
    assert response.tunneling_info is not None
    conf = parse_swanctl(response.device.profile.decode())
    (conn,) = conf["connections"].values()  # type: ignore[union-attr]
    loaded = _ppk_secret(roles, agent_conn_name(response.tunneling_info.ticket))
    assert conn["ppk_required"] == "yes"
    assert [conn["ppk_id"]] == loaded["owners"]


def test_without_a_post_quantum_minimum_there_is_no_ppk(roles: Roles) -> None:
    response = enrol_device(roles, "apple")
    assert response.device is not None
    assert response.tunneling_info is not None
    assert "PPK" not in plistlib.loads(response.device.profile)["PayloadContent"][2]["IKEv2"]
    assert roles.charon.messages("load-shared") == []
    assert "ppk_id" not in roles.charon.conns[agent_conn_name(response.tunneling_info.ticket)]


@pytest.mark.parametrize(("platform", "label"), [("android", "strongSwan VPN Client for Android (android)"),
                                                  ("windows", "Windows 10/11 built-in IKEv2 (windows)"),
                                                  ("networkmanager", "NetworkManager strongSwan plugin")])
def test_a_platform_without_post_quantum_is_refused_by_name_with_nothing_loaded(roles: Roles, platform: str,
                                                                                label: str) -> None:
    with pytest.raises(PlatformCannot, match="no post-quantum setting") as refused:
        enrol_device(roles, platform, post_quantum=5)
    assert label in refused.value.message
    assert not roles.charon.conns
    assert not roles.charon.certs
    assert roles.charon.messages("load-shared") == []
    with roles.store.unit() as uow:
        assert uow.sessions.select() == []


def test_a_charon_restart_loads_the_device_and_its_ppk_again(roles: Roles) -> None:
    info = enrol_device(roles, "apple", post_quantum=5).tunneling_info
    assert info is not None
    conn = agent_conn_name(info.ticket)
    first = _ppk_secret(roles, conn)
    before = dict(roles.charon.conns[conn])
    roles.restart_charon()
    assert roles.target.reconcile().vanished == []
    assert roles.charon.conns[conn] == before
    assert conn in roles.charon.shared
    again = [m for m in roles.charon.messages("load-shared") if m["id"] == conn]
    assert len(again) == 2
    assert _as_sent(again[1]) == first


def test_a_sealed_ppk_opens_only_with_its_targets_key_for_its_own_session(tmp_path: Path) -> None:
    kit = LocalDeviceKit(tmp_path / "ca", owner="hq.qoss")
    sealed = kit.seal_ppk(b"k" * 32, context="ticket-1 qoss-ppk-1")
    assert b"k" * 32 not in sealed.encode()
    assert (tmp_path / "ca" / PPK_KEY_FILE).stat().st_mode & 0o077 == 0
    assert LocalDeviceKit(tmp_path / "ca", owner="hq.qoss").open_ppk(sealed, context="ticket-1 qoss-ppk-1") == b"k" * 32
    for context in ("ticket-2 qoss-ppk-1", "ticket-1 qoss-ppk-2"):
        with pytest.raises(ValueError, match="does not open"):
            kit.open_ppk(sealed, context=context)
    with pytest.raises(ValueError, match="does not open"):
        LocalDeviceKit(tmp_path / "other", owner="hq.qoss").open_ppk(sealed, context="ticket-1 qoss-ppk-1")
    with pytest.raises(ValueError, match="does not open"):
        kit.open_ppk(sealed[:-4] + "AAAA", context="ticket-1 qoss-ppk-1")


def test_the_preview_of_an_edit_raising_the_post_quantum_minimum_names_the_devices_that_cannot_follow(
        roles: Roles, database: FakeDatabase) -> None:
    android = enrol_device(roles, "android").tunneling_info
    assert android is not None
    with database.unit() as uow:
        _require_post_quantum(uow, "platform-android", 5)
        report = preview(uow, default_table=TABLE, sessions=active_sessions(roles.store))
    (impact,) = [s for s in report.sessions_list() if s["ticket"] == android.ticket]
    assert impact["kind"] == "noncompliant"
    assert impact["platform"] == "android"
    assert impact["reason"].startswith("its platform cannot follow: strongSwan VPN Client for Android (android)")
    assert "the strongSwan app has no post-quantum setting" in impact["reason"]


def _connect(roles: Roles, **levels: int) -> Response:
    """A client's connect through Host, declaring its charon's algorithms (5.9.8: a PPK among them)."""
    supports = tuple(sorted(keywords_from_charon(roles.client_charon.algorithms, version="5.9.8")))
    request, wire = roles.client.request(Kind.CONNECT, RequestInfo(target="hq", supports=supports,
                                                                   min_levels=levels), 3)
    return roles.client.accept(roles.host.handle(wire).answer, request)


def test_a_clients_tunnel_with_a_post_quantum_minimum_gets_the_ppk_target_loaded(roles: Roles) -> None:
    response = _connect(roles, post_quantum=5)
    info = response.tunneling_info
    assert info is not None
    assert response.ppk is not None
    assert info.ppk_id is not None
    assert info.suite["post_quantum"] == "ppk"
    conn = agent_conn_name(info.ticket)
    loaded = _as_sent(next(m for m in roles.charon.messages("load-shared") if m["type"] == "PPK"))
    assert (loaded["id"], loaded["owners"], loaded["data"]) == (ppk_name(conn), [info.ppk_id], response.ppk)
    assert (roles.charon.conns[conn]["ppk_id"], roles.charon.conns[conn]["ppk_required"]) == (info.ppk_id, "yes")
    client = client_conn(name=conn, info=info, client_address=None)
    assert (client["ppk_id"], client["ppk_required"]) == (info.ppk_id, "yes")
    (listed,) = roles.target.sessions()
    assert listed["suite"]["ppk"] == {"id": info.ppk_id}  # the key itself is not kept
    assert roles.disconnect(info.ticket) is Kind.CLOSED
    assert ppk_name(conn) not in roles.charon.shared
    assert conn not in roles.charon.conns


def test_a_clients_tunnel_without_a_minimum_has_no_ppk(roles: Roles) -> None:
    response = _connect(roles)
    assert response.ppk is None
    assert response.tunneling_info is not None
    assert response.tunneling_info.ppk_id is None
    assert [m for m in roles.charon.messages("load-shared") if m["type"] == "PPK"] == []
    assert "ppk_id" not in roles.charon.conns[agent_conn_name(response.tunneling_info.ticket)]


def test_a_device_with_a_ppk_stays_when_nothing_it_runs_on_changed(roles: Roles, database: FakeDatabase) -> None:
    info = enrol_device(roles, "apple", post_quantum=5).tunneling_info
    assert info is not None
    with database.unit() as uow:
        [impact] = assess_sessions(uow, active_sessions(roles.store), default_table=TABLE)
    assert (impact.ticket, impact.kind) == (info.ticket, "stays"), impact.reason


def test_a_post_quantum_minimum_of_a_stored_policy_refuses_a_platform_without_one_by_its_reason(
        roles: Roles, database: FakeDatabase) -> None:
    with database.unit() as uow:
        _require_post_quantum(uow, "platform-windows", 4)
        uow.commit()
    with pytest.raises(PlatformCannot) as refused:
        enrol_device(roles, "windows")  # the user asks for none; the platform's own table does
    assert refused.value.message.startswith("Windows 10/11 built-in IKEv2 (windows): no post-quantum protection "
                                            "at level 4: the built-in client has no post-quantum setting")
    assert not roles.charon.conns


def test_the_clients_charon_counts_a_ppk_and_a_cache_from_before_is_read_again(roles: Roles) -> None:
    algorithms, _ = roles.client.capabilities()
    assert "ppk" in algorithms  # charon 5.9.8: a PPK, though get-algorithms lists none
    path = roles.client.config.state_dir / "capabilities.json"
    raw = json.loads(path.read_text())
    old = {k: v for k, v in raw.items() if k != "format"}
    path.write_text(json.dumps({**old, "algorithms": [a for a in algorithms if a != "ppk"]}))
    again = AgentClient(config=roles.client.config, keys=ALICE, crypto=CRYPTO,  # the next qoss agent connect
                        vici=gateway(roles.client_charon.socket_path), post=lambda url, wire: b"", clock=roles.clock)
    assert "ppk" in again.capabilities()[0]
