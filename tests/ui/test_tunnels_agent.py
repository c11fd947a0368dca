"""Tunnels in the console (detail with what charon says, tear-down confirmed and scoped, the
list's rows for htmx, the session's own event stream) and the agent page (users enrolled from
a key file, revoked; sessions), over a fake charon that speaks VICI."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.adapters.agent.crypto import KeyPair
from app.settings import Settings
from app.ui.pages.tunnels import PAGE_ROWS
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import register_keys
from tests.fixtures.secrets import register
from tests.fixtures.tunnel_records import add_tunnel_records
from tests.ui.conftest import HTMX, client_of, gateway_app, sign_in

pytestmark = pytest.mark.anyio
PSK = "a-pre-shared-key-of-32-characters-or-more"
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>'


@pytest.fixture
async def served(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """An app with one gateway, ``left``, on a fake charon that brings every conn up, and one tunnel."""
    register(PSK)
    async with gateway_app(settings, tmp_path, event_stream_seconds=0.3) as (app, api):
        r = await api.post("/v1/tunnels", json={
            "initiator": "left", "remote_ts": ["10.2.0.0/24"], "min_levels": {"integrity": 5},
            "peer": {"address": "10.99.0.2", "identity": "peer.example", "psk": PSK}})
        assert r.status_code == 201, r.text
        yield app, r.json()["id"]



async def test_a_tunnels_detail_its_rows_and_a_confirmed_tear_down(
        served: tuple[Any, str], token: Callable[..., str]) -> None:
    app, tunnel_id = served
    async with client_of(app) as client:
        csrf = await sign_in(client, token("operator", ["tunnels:write", "tunnels:read"]))
        listing = await client.get("/ui/tunnels")
        assert f'href="/ui/tunnels/{tunnel_id}"' in listing.text
        assert 'data-events="tunnel.created tunnel.deleted tunnel.state tunnel.moved"' in listing.text
        rows = await client.get("/ui/tunnels/rows", headers=HTMX)
        assert rows.text.lstrip().startswith("<tr") and tunnel_id in rows.text  # noqa: PT018
        assert (await client.get("/ui/tunnels/rows")).status_code == 303  # without htmx: the page
        detail = await client.get(f"/ui/tunnels/{tunnel_id}")
        assert detail.status_code == 200
        for shown in ("10.99.0.2", "peer.example", "10.2.0.0/24", "Provenance", "Bytes in / out",
                      f'href="/ui/tunnels/{tunnel_id}/teardown"'):
            assert shown in detail.text, shown
        confirm = await client.get(f"/ui/tunnels/{tunnel_id}/teardown")
        assert f"Tear down tunnel {tunnel_id}?" in confirm.text
        gone = await client.post(f"/ui/tunnels/{tunnel_id}/teardown", data={"csrf": csrf})
        assert (gone.status_code, gone.headers["location"]) == (303, "/ui/tunnels")
        assert "No tunnels." in (await client.get("/ui/tunnels")).text
        assert (await client.get(f"/ui/tunnels/{tunnel_id}")).status_code == 404


async def test_the_list_shows_a_page_of_tunnels_and_its_rows_are_read_again_for_that_page(
        app: Any, settings: Settings, token: Callable[..., str]) -> None:
    ordered = add_tunnel_records(settings.database_url, PAGE_ROWS + 1)
    async with client_of(app) as client:
        await sign_in(client, token("reader", ["tunnels:read"]))
        first = await client.get("/ui/tunnels")
        shown = re.findall(r'<tr id="tunnel-([a-z0-9-]+)"', first.text)
        assert shown == ordered[:PAGE_ROWS]
        after = re.search(r'href="/ui/tunnels\?cursor=([A-Za-z0-9_-]+)" rel="next"', first.text)
        assert after is not None
        second = await client.get(f"/ui/tunnels?cursor={after.group(1)}")
        assert re.findall(r'<tr id="tunnel-([a-z0-9-]+)"', second.text) == ordered[PAGE_ROWS:]
        assert 'rel="next"' not in second.text
        assert 'href="/ui/tunnels">First page' in second.text
        assert f'hx-get="/ui/tunnels/rows?cursor={after.group(1)}"' in second.text
        rows = await client.get(f"/ui/tunnels/rows?cursor={after.group(1)}", headers=HTMX)
        assert re.findall(r'<tr id="tunnel-([a-z0-9-]+)"', rows.text) == ordered[PAGE_ROWS:]
        refused = await client.get("/ui/tunnels?cursor=bm90LWEtY3Vyc29y")
        assert refused.status_code == 422
        assert "cursor" in refused.text


async def test_tear_down_needs_tunnels_write_and_csrf(served: tuple[Any, str], token: Callable[..., str]) -> None:
    app, tunnel_id = served
    async with client_of(app) as reader, client_of(app) as writer:
        csrf = await sign_in(reader, token("reader", ["tunnels:read"]))
        assert "/teardown" not in (await reader.get(f"/ui/tunnels/{tunnel_id}")).text
        assert (await reader.get(f"/ui/tunnels/{tunnel_id}/teardown")).status_code == 403
        assert (await reader.post(f"/ui/tunnels/{tunnel_id}/teardown", data={"csrf": csrf})).status_code == 403
        await sign_in(writer, token("writer", ["tunnels:write", "tunnels:read"]))
        assert (await writer.post(f"/ui/tunnels/{tunnel_id}/teardown", data={})).status_code == 403
        assert tunnel_id in (await reader.get("/ui/tunnels")).text


async def test_the_sessions_event_stream_shows_what_its_scopes_allow(
        served: tuple[Any, str], token: Callable[..., str]) -> None:
    app, tunnel_id = served
    async with client_of(app) as reader, client_of(app) as editor, client_of(app) as nobody:
        await sign_in(reader, token("reader", ["tunnels:read"]))
        await sign_in(editor, token("editor", ["ratings:write"]))
        seen = await reader.get("/ui/events", params={"after": 0})
        assert seen.headers["content-type"].startswith("text/event-stream")
        assert "event: tunnel.created" in seen.text and tunnel_id in seen.text  # noqa: PT018
        assert "content-security-policy" in seen.headers
        assert "event: tunnel.created" not in (await editor.get("/ui/events", params={"after": 0})).text
        assert (await nobody.get("/ui/events")).status_code == 303  # no session: the sign-in page


@pytest.fixture
def agent_app(host_app: tuple[Any, KeyPair]) -> Any:
    """The app that plays Host (tests/ui/conftest.py's ``host_app``)."""
    return host_app[0]


def _key_file(user: KeyPair) -> bytes:
    return json.dumps({"id": user.name, **user.public.as_dict()}).encode()


async def test_users_are_enrolled_from_a_key_file_and_revoked(agent_app: Any, token: Callable[..., str]) -> None:
    user = KeyPair.generate("alice")
    register_keys(user)
    async with client_of(agent_app) as client:
        csrf = await sign_in(client, token("enroller", ["agent:enroll", "tunnels:read"]))
        page = await client.get("/ui/agent")
        assert "No users enrolled." in page.text and "No live sessions." in page.text  # noqa: PT018
        answer = await client.post("/ui/agent/users", data={"csrf": csrf, "objective1": "on", "objective3": "on"},
                                   files={"keyfile": ("alice.pub.json", _key_file(user), "application/json")})
        assert answer.status_code == 201 and "alice is enrolled for Objective-IDs 1, 3" in answer.text  # noqa: PT018
        admin = make_token(agent_app.state.runtime.settings.database_url, "admin", ["admin"])
        users = (await client.get("/v1/agent/users", headers={"Authorization": f"Bearer {admin}"})).json()
        assert [(u["user_id"], u["objectives"]) for u in users] == [("alice", [1, 3])]
        again = await client.post("/ui/agent/users", data={"csrf": csrf, "objective3": "on"},
                                  files={"keyfile": ("alice.pub.json", _key_file(user), "application/json")})
        assert again.status_code == 409
        assert "Revoke alice?" in (await client.get("/ui/agent/users/alice/revoke")).text
        revoked = await client.post("/ui/agent/users/alice/revoke", data={"csrf": csrf})
        assert revoked.status_code == 200 and "alice is revoked" in revoked.text  # noqa: PT018
        users = (await client.get("/v1/agent/users", headers={"Authorization": f"Bearer {admin}"})).json()
        assert users[0]["revoked_at"] is not None


@pytest.mark.parametrize(("content", "fields", "says"), [
    (b"not json", {"objective3": "on"}, "not JSON"),
    (json.dumps({"id": "bob", "sign_public_key": "x", "kem_public_key": "y"}).encode(), {"objective3": "on"},
     "sign_public_key"),
    (None, {}, "tick at least one Objective-ID"),
    (json.dumps({"id": HOSTILE, "sign_public_key": "x", "kem_public_key": "y"}).encode(), {"objective3": "on"},
     "user_id"),
])
async def test_a_bad_key_file_enrols_no_one_and_says_why(agent_app: Any, token: Callable[..., str],
                                                        content: bytes | None, fields: dict[str, str],
                                                        says: str) -> None:
    user = KeyPair.generate("bob")
    register_keys(user)
    async with client_of(agent_app) as client:
        csrf = await sign_in(client, token("enroller", ["agent:enroll"]))
        answer = await client.post("/ui/agent/users", data={"csrf": csrf, **fields},
                                   files={"keyfile": ("k.json", content or _key_file(user), "application/json")})
        assert answer.status_code == 422
        assert says in answer.text and "No users enrolled." in answer.text  # noqa: PT018
        assert "<script>alert" not in answer.text and "<img" not in answer.text  # noqa: PT018


async def test_the_agent_page_needs_agent_enroll_or_tunnels_read(agent_app: Any, token: Callable[..., str]) -> None:
    async with client_of(agent_app) as editor, client_of(agent_app) as reader:
        csrf = await sign_in(editor, token("editor", ["ratings:write"]))
        assert (await editor.get("/ui/agent")).status_code == 403
        assert 'href="/ui/agent"' not in (await editor.get("/ui/tables")).text
        assert (await editor.post("/ui/agent/users", data={"csrf": csrf})).status_code == 403
        await sign_in(reader, token("reader", ["tunnels:read"]))
        page = await reader.get("/ui/agent")
        assert page.status_code == 200 and "Enrol a user" not in page.text  # noqa: PT018
        assert "Live sessions" in page.text


async def test_without_agent_roles_the_page_says_so(browser: Callable[[], httpx.AsyncClient],
                                                    token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("enroller", ["agent:enroll"]))
    page = await client.get("/ui/agent")
    assert page.status_code == 200 and "plays neither the agent's Host nor its Target role" in page.text  # noqa: PT018
