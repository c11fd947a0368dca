"""The console invites a user's phone from where it lists the agent's users (``agent:enroll``): the
link is shown once with a QR code of it; Host keeps no secret to show again; a user with keys of
their own is refused with what to do instead; a reader cannot invite."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from app.adapters.agent.crypto import KeyPair
from tests.ui.conftest import client_of, sign_in

pytestmark = pytest.mark.anyio


@pytest.fixture
def agent_app(host_app: tuple[Any, KeyPair]) -> Any:
    """The app that plays Host (tests/ui/conftest.py's ``host_app``)."""
    return host_app[0]


async def test_an_enroller_invites_a_phone_and_sees_the_link_once(agent_app: Any, token: Callable[..., str]) -> None:
    async with client_of(agent_app) as client:
        csrf = await sign_in(client, token("enroller", ["agent:enroll"]))
        page = await client.get("/ui/agent")
        assert 'action="/ui/agent/invitations"' in page.text
        done = await client.post("/ui/agent/invitations", data={"csrf": csrf, "user_id": "pat", "platform": "apple"})
        assert done.status_code == 201, done.text
        (link,) = re.findall(r'<code class="key" id="invited-link">(http://qoss\.test/ui/join#i=[A-Za-z0-9_-]{43})</code>',
                             done.text)
        assert "<svg" in done.text  # the QR code, drawn on the server: no script
        secret = link.split("#i=", 1)[1]
        again = await client.get("/ui/agent")
        assert secret not in again.text
        listed = agent_app.state.runtime.agent_host.invitations.list()
        assert [(i["user_id"], i["platform"], i["created_by"], i["state"]) for i in listed] == [
            ("pat", "apple", "enroller", "waiting")]
        bad = await client.post("/ui/agent/invitations", data={"csrf": csrf, "user_id": "pat", "platform": "nokia"})
        assert bad.status_code == 422
        assert "Not invited" in bad.text
        no_csrf = await client.post("/ui/agent/invitations", data={"user_id": "x", "platform": "apple"})
        assert no_csrf.status_code == 403


async def test_a_reader_cannot_invite(agent_app: Any, token: Callable[..., str]) -> None:
    async with client_of(agent_app) as client:
        csrf = await sign_in(client, token("reader", ["tunnels:read"]))
        done = await client.post("/ui/agent/invitations", data={"csrf": csrf, "user_id": "pat", "platform": "apple"})
        assert done.status_code == 403
    assert agent_app.state.runtime.agent_host.invitations.list() == []
