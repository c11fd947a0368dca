"""Policies (list, history, revert), tunnels and gateways (read-only), the audit log (filtered):
each shown only to a token whose scopes allow it, hostile text inert."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from tests.ui.conftest import sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>'


async def _edit_policy(client: httpx.AsyncClient, admin: str, description: str) -> None:
    auth = {"Authorization": f"Bearer {admin}"}
    current = await client.get("/v1/policies/voip", headers=auth)
    body = current.json()["policy"]
    answer = await client.put("/v1/policies/voip", json={**body, "description": description},
                              headers={**auth, "If-Match": current.headers["etag"]})
    assert answer.status_code == 200, answer.text


async def test_policies_history_and_revert(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    admin = token("policy-admin", ["policies:write"])
    await _edit_policy(client, admin, HOSTILE)
    csrf = await sign_in(client, admin)
    listing = await client.get("/ui/policies")
    assert 'href="/ui/policies/voip/revisions"' in listing.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in listing.text and "<img" not in listing.text  # noqa: PT018
    history = await client.get("/ui/policies/voip/revisions")
    assert "Revision 2" in history.text and "description" in history.text  # noqa: PT018
    assert "<script>alert" not in history.text and "<img" not in history.text  # noqa: PT018
    assert 'href="/ui/policies/voip/revert?revision=1">Revert to revision 1' in history.text
    asked = await client.get("/ui/policies/voip/revert", params={"revision": "1"})  # what it changes, first
    assert asked.status_code == 200 and "Revert voip to revision 1?" in asked.text  # noqa: PT018
    assert re.search(r'<td>description</td>\s*<td class="old">&lt;script&gt;alert\(1\)', asked.text)
    assert "<script>alert" not in asked.text and "No tunnel is running" in asked.text  # noqa: PT018
    assert (await client.get("/v1/policies/voip")).json()["revision"] == 2  # asking kept nothing
    answer = await client.post("/ui/policies/voip/revert", data={"csrf": csrf, "revision": "1", "expected": "2"})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/policies/voip/revisions")
    policy = (await client.get("/v1/policies/voip")).json()
    assert policy["revision"] == 3 and policy["policy"].get("description") != HOSTILE  # noqa: PT018


async def test_a_token_without_policies_write_cannot_revert_a_policy(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await _edit_policy(client, token("policy-admin", ["policies:write"]), "changed")
    csrf = await sign_in(client, token("tables-only", ["ratings:write"]))
    history = await client.get("/ui/policies/voip/revisions")
    assert history.status_code == 200 and "Revert" not in history.text  # noqa: PT018
    forged = await client.post("/ui/policies/voip/revert", data={"csrf": csrf, "revision": "1", "expected": "2"})
    assert forged.status_code == 403
    assert (await client.get("/v1/policies/voip")).json()["revision"] == 2


async def test_tunnels_and_gateways_need_tunnels_read(browser: Browser, token: Callable[..., str]) -> None:
    reader, editor = browser(), browser()
    await sign_in(reader, token("reader", ["tunnels:read"]))
    await sign_in(editor, token("editor", ["ratings:write"]))
    for path, empty in (("/ui/tunnels", "No tunnels."), ("/ui/gateways", "No gateways.")):
        shown = await reader.get(path)
        assert shown.status_code == 200 and empty in shown.text  # noqa: PT018
        assert f'href="{path}"' in shown.text  # in the navigation
        refused = await editor.get(path)
        assert refused.status_code == 403
        assert f'href="{path}"' not in (await editor.get("/ui/tables")).text


async def test_the_audit_log_filters_and_shows_hostile_paths_inert(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await client.post("/v1/rating-tables/%3Cscript%3Ealert(1)%3C%2Fscript%3E/revert", json={})  # 404, audited
    auditor_token = token("auditor", ["audit:read"])
    await sign_in(client, auditor_token)
    everything = await client.get("/ui/audit")
    assert everything.status_code == 200
    assert "/v1/rating-tables/&lt;script&gt;alert(1)&lt;/script&gt;/revert" in everything.text
    assert "<script>alert" not in everything.text
    refusals = await client.get("/ui/audit", params={"outcome": "404"})
    assert "/ui/login" not in refusals.text.split('<tbody id="audit-rows"')[1]  # the sign-in was a 303
    assert "&lt;script&gt;" in refusals.text
    posts = await client.get("/ui/audit", params={"action": "POST", "outcome": "303"})
    rows = posts.text.split('<tbody id="audit-rows"')[1]
    assert "/ui/login" in rows and "&lt;script&gt;" not in rows  # noqa: PT018
    api = await client.get("/v1/audit", params={"outcome": 404, "action": "POST"},
                           headers={"Authorization": f"Bearer {auditor_token}"})
    assert api.status_code == 200 and {(r["outcome"], r["action"]) for r in api.json()} == {(404, "POST")}  # noqa: PT018


async def test_the_audit_log_needs_audit_read(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("editor", ["ratings:write"]))
    assert (await client.get("/ui/audit")).status_code == 403
    assert 'href="/ui/audit"' not in (await client.get("/ui/tables")).text
