"""API tokens in the console (``/ui/tokens``, ``admin`` only): the list without secrets, a new
token whose secret is shown once, refusals that keep nothing, revocation after a confirmation;
every change behind CSRF and audited as ``POST /v1/tokens`` and ``DELETE /v1/tokens/{id}`` are."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.fixtures.secrets import register
from tests.ui.conftest import rows, sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
_SECRET = re.compile(r'id="new-token"[^>]*value="(qoss_[0-9a-f]{12}_[A-Za-z0-9_-]{43})"')


async def _audit(app: Any, settings: Settings, path: str) -> list[tuple[Any, ...]]:
    await asyncio.to_thread(app.state.runtime.auditor.flush)  # never on the event loop
    return await asyncio.to_thread(rows, settings, "SELECT action, object, outcome, token_name, detail "
                                   "FROM audit_events WHERE object LIKE :path ORDER BY id", path=path)


def _form(csrf: str, **fields: str) -> dict[str, str]:
    return {"csrf": csrf, "name": "colleague", "scope:ratings:write": "on", "days": "30", **fields}


async def test_only_an_admin_sees_the_tokens(browser: Browser, token: Callable[..., str]) -> None:
    admin, editor = browser(), browser()
    await sign_in(admin, token("root", ["admin"]))
    await sign_in(editor, token("editor", ["ratings:write", "audit:read"]))
    assert 'href="/ui/tokens"' in (await admin.get("/ui/tables")).text
    assert 'href="/ui/tokens"' not in (await editor.get("/ui/tables")).text
    refused = await editor.get("/ui/tokens")
    assert refused.status_code == 403
    assert "admin" in refused.text
    listing = await admin.get("/ui/tokens")
    assert listing.status_code == 200
    assert "<th scope=\"row\">editor</th>" in listing.text
    assert "audit:read, ratings:write" in listing.text  # sorted, as the API lists them


async def test_a_new_token_is_shown_once_listed_without_its_secret_and_audited(
        browser: Browser, token: Callable[..., str], app: Any, settings: Settings) -> None:
    client = browser()
    csrf = await sign_in(client, token("root", ["admin"]))
    made = await client.post("/ui/tokens", data=_form(csrf, **{"scope:tunnels:read": "on", "days": "7"}))
    assert made.status_code == 201, made.text
    found = _SECRET.search(made.text)
    assert found, made.text
    secret = found.group(1)
    register(secret)  # the secret sweep: never in the database or a log
    token_id = secret.split("_")[1]
    assert "only place it is ever shown" in made.text
    assert made.headers["cache-control"] == "no-store"

    listing = (await client.get("/ui/tokens")).text
    row = re.search(rf'<tr id="token-{token_id}">(.*?)</tr>', listing, re.DOTALL)
    assert row, listing
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>",
                                                                                   row.group(1), re.DOTALL)]
    assert cells[:3] == ["colleague", token_id, "ratings:write, tunnels:read"]
    assert cells[4:7] == ["root", cells[5], "active"] and cells[5].endswith("UTC")  # noqa: PT018
    assert secret.split("_", 2)[2] not in listing

    used = await client.get("/v1/audit", headers={"Authorization": f"Bearer {secret}"})
    assert used.status_code == 403  # a real token: known, without audit:read
    assert (await client.get("/v1/tokens", headers={"Authorization": f"Bearer {secret}"})).status_code == 403
    audit = await _audit(app, settings, "/ui/tokens")
    assert audit == [("POST", "/ui/tokens", 201, "root",
                      f"token {token_id} created, scopes ratings:write,tunnels:read")]
    assert rows(settings, "SELECT created_by FROM api_tokens WHERE id = :id", id=token_id) == [("root",)]


_BAD = [
    ({"name": "  "}, "give the token a name"),
    ({"name": "two words"}, "a token name is 1-64 characters"),
    ({"scope:ratings:write": "", "scope:tunnels:read": ""}, "tick at least one scope"),
    ({"days": "0"}, "whole number of days from 1 to 366"),
    ({"days": "367"}, "whole number of days from 1 to 366"),
    ({"days": "1.5"}, "whole number of days from 1 to 366"),
    ({"days": ""}, "whole number of days from 1 to 366"),
]


async def test_bad_input_gets_the_form_back_with_a_message_and_keeps_nothing(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client = browser()
    csrf = await sign_in(client, token("root", ["admin"]))
    before = rows(settings, "SELECT id FROM api_tokens")
    for fields, message in _BAD:
        sent = _form(csrf, **{"scope:tunnels:read": "on", **fields})
        answer = await client.post("/ui/tokens", data=sent)
        assert answer.status_code == 422, fields
        assert message in html.unescape(answer.text), fields
        assert 'id="new-token"' not in answer.text and "qoss_" not in answer.text  # noqa: PT018
        ticked = 'name="scope:tunnels:read" value="on" checked>' in answer.text  # the form again, as it was sent
        assert ticked == bool(sent["scope:tunnels:read"]), fields
        assert 'name="name"' in answer.text
        assert f'value="{html.escape(sent["name"])}"' in answer.text
    assert rows(settings, "SELECT id FROM api_tokens") == before


async def test_making_a_token_needs_the_csrf_token_and_admin(browser: Browser, token: Callable[..., str],
                                                             settings: Settings) -> None:
    admin, other = browser(), browser()
    await sign_in(admin, token("root", ["admin"]))
    other_csrf = await sign_in(other, token("auditor", ["audit:read", "tunnels:read"]))
    before = rows(settings, "SELECT id FROM api_tokens")
    assert (await admin.post("/ui/tokens", data={**_form(""), "csrf": "forged"})).status_code == 403
    assert (await other.post("/ui/tokens", data=_form(other_csrf))).status_code == 403
    assert rows(settings, "SELECT id FROM api_tokens") == before


async def test_revoking_asks_first_then_ends_the_token_and_is_audited(
        browser: Browser, token: Callable[..., str], app: Any, settings: Settings) -> None:
    client = browser()
    csrf = await sign_in(client, token("root", ["admin"]))
    victim = token("leaver", ["tunnels:read"])
    token_id = victim.split("_")[1]
    listing = (await client.get("/ui/tokens")).text
    assert f'href="/ui/tokens/{token_id}/revoke"' in listing
    confirm = await client.get(f"/ui/tokens/{token_id}/revoke")
    assert confirm.status_code == 200
    assert "Revoke token leaver" in confirm.text
    assert f'action="/ui/tokens/{token_id}/revoke"' in confirm.text
    assert (await client.post(f"/ui/tokens/{token_id}/revoke", data={})).status_code == 403  # no CSRF token
    assert (await client.get("/v1/policies", headers={"Authorization": f"Bearer {victim}"})).status_code == 200
    done = await client.post(f"/ui/tokens/{token_id}/revoke", data={"csrf": csrf})
    assert done.status_code == 303
    assert done.headers["location"] == f"/ui/tokens?revoked={token_id}"
    after = (await client.get(done.headers["location"])).text
    assert f"Token {token_id} is revoked." in after
    assert re.search(rf'<tr id="token-{token_id}">.*?state-revoked', after, re.DOTALL)
    assert f'href="/ui/tokens/{token_id}/revoke"' not in after
    assert (await client.get("/v1/tunnels", headers={"Authorization": f"Bearer {victim}"})).status_code == 401
    assert (await client.get("/ui/tokens/0123456789ab/revoke")).status_code == 404
    audit = await _audit(app, settings, f"/ui/tokens/{token_id}/revoke")
    assert ("POST", f"/ui/tokens/{token_id}/revoke", 303, "root", f"token {token_id} revoked") in audit
    assert len([a for a in audit if a[2] == 303]) == 1  # the refusal made nothing: one revocation
