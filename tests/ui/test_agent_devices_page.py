"""A user's devices in the console (``/ui/agent/users/{user_id}/devices``, ``agent:enroll``): each
device with its platform, target and state (a stale one with its reason), a confirmed revoke that
ends it, and the page needing its scope. The devices here are sessions as Target records them (no
charon behind it); the same against real charons: ``tests/integration/agent/test_my_devices.py``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.adapters.agent.crypto import KeyPair
from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.db.engine import make_engine, make_session_factory
from app.domain.agent.ports import AgentSession
from app.settings import Settings
from tests.fixtures.agent_roles import SERVER_ID, register_keys
from tests.ui.conftest import client_of, sign_in

pytestmark = pytest.mark.anyio
HOSTILE = "<script>alert(1)</script>"


def record_device(settings: Settings, ticket: str, *, platform: str, state: str = "active", reason: str = "") -> None:
    """A device enrolment of alice's as Target records it."""
    session = AgentSession(
        ticket=ticket, user_id="alice", host_id=SERVER_ID, request_id="00" * 16, objective_id=3, protection="esp",
        conn=f"qoss-agent-{ticket[:16]}", pool=None, virtual_ip=None, client_identity=f"{ticket[:12]}.alice",
        suite={}, state=state, reason=reason, expires_at=datetime.now(UTC) + timedelta(days=30), platform=platform)
    engine = make_engine(settings.database_url)
    try:
        with SqlAgentStore(make_session_factory(engine)).unit() as uow:
            uow.sessions.add(session)
            uow.commit()
    finally:
        engine.dispose()


@pytest.fixture
def agent_app(host_app: tuple[Any, KeyPair]) -> Any:
    """The app that plays Host (tests/ui/conftest.py's ``host_app``), alice enrolled."""
    app, _ = host_app
    user = KeyPair.generate("alice")
    register_keys(user)
    app.state.runtime.agent_host.enroll(user_id="alice", objectives=[3], **user.public.as_dict())
    return app


async def test_a_users_devices_are_listed_with_their_states_and_one_is_revoked_after_asking(
        agent_app: Any, settings: Settings, token: Callable[..., str]) -> None:
    phone, laptop = "a1" * 16, "b2" * 16
    record_device(settings, phone, platform="android")
    record_device(settings, laptop, platform="networkmanager", state="closed",
                  reason=f"policy platform-networkmanager {HOSTILE} puts aes128 below objective 3's minimums: "
                         "its profile is stale: enrol the device again")
    async with client_of(agent_app) as client:
        csrf = await sign_in(client, token("enroller", ["agent:enroll"]))
        assert 'href="/ui/agent/users/alice/devices"' in (await client.get("/ui/agent")).text
        page = await client.get("/ui/agent/users/alice/devices")
        assert page.status_code == 200, page.text
        rows = dict(re.findall(r'<tr id="device-([0-9a-f]{32})" data-state="([a-z]+)"', page.text))
        assert rows == {phone: "active", laptop: "stale"}
        assert "its profile is stale: enrol the device again" in page.text
        assert HOSTILE not in page.text  # a reason is text, never markup
        assert "strongSwan app" in page.text or "Android" in page.text
        assert page.text.count("/revoke\"") == 1  # only the active one can be revoked
        confirm = await client.get(f"/ui/agent/users/alice/devices/{phone}/revoke")
        assert "Revoke this device of alice?" in confirm.text
        done = await client.post(f"/ui/agent/users/alice/devices/{phone}/revoke", data={"csrf": csrf})
        assert done.status_code == 200, done.text
        assert "is revoked at" in done.text
        assert f'<tr id="device-{phone}" data-state="revoked"' in done.text
        assert "device revoked by an administrator" in done.text
        again = await client.post(f"/ui/agent/users/alice/devices/{phone}/revoke", data={"csrf": csrf})
        assert again.status_code == 404
        assert "Not revoked" in again.text
        assert (await client.post(f"/ui/agent/users/alice/devices/{phone}/revoke", data={})).status_code == 403


async def test_the_devices_page_needs_agent_enroll(agent_app: Any, token: Callable[..., str]) -> None:
    async with client_of(agent_app) as client:
        await sign_in(client, token("reader", ["tunnels:read"]))
        assert (await client.get("/ui/agent/users/alice/devices")).status_code == 403
        assert (await client.get(f"/ui/agent/users/alice/devices/{'a1' * 16}/revoke")).status_code == 403
    async with client_of(agent_app) as client:
        await sign_in(client, token("enroller", ["agent:enroll"]))
        assert (await client.get("/ui/agent/users/nobody/devices")).status_code == 404
