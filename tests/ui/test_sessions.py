"""Signing in and out of the console: the session cookie, its life, CSRF, the headers."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.services.auth import revoke_token
from app.settings import Settings
from tests.ui.conftest import HTMX, csrf_of, sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]


def _cookie_header(answer: httpx.Response, name: str) -> str:
    found = [v for v in answer.headers.get_list("set-cookie") if v.startswith(f"{name}=")]
    assert found, answer.headers
    return found[0]


def _session_hashes(settings: Settings) -> list[str]:
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            return [row[0] for row in conn.execute(text("SELECT id_hash FROM ui_sessions"))]
    finally:
        engine.dispose()


async def test_every_page_needs_a_session(browser: Browser) -> None:
    client = browser()
    for path in ("/ui", "/ui/tables", "/ui/tables/esaf-2006", "/ui/negotiate", "/ui/tables/esaf-2006/revisions"):
        answer = await client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] in ("/ui/login", "/ui/tables")
    answer = await client.get("/ui/tables", headers=HTMX)
    assert (answer.status_code, answer.headers["hx-reswap"]) == (401, "none")  # htmx: the notice, nothing swapped
    assert "hx-redirect" not in answer.headers


SESSION_ENDED = re.compile(
    r'<div id="session-ended" class="error session-ended" role="alert">\s*<p>Your session has ended: '
    r'<a href="/ui/login" target="_blank" rel="noopener">sign in again in a new tab</a>,\s*'
    r"then save again — what you typed is kept.</p>")


async def test_an_htmx_request_after_the_session_ended_swaps_nothing_and_says_so(
        browser: Browser, token: Callable[..., str]) -> None:
    admin, elsewhere = browser(), browser()
    csrf = await sign_in(admin, token())
    row = "/ui/tables/esaf-2006/ratings/sha1"
    form = (await admin.get(f"{row}/edit", headers=HTMX)).text
    revision = re.search(r'name="revision" value="(\d+)"', form)
    assert revision
    typed = {"csrf": csrf, "revision": revision.group(1), "integrity": "6", "performance": "6", "reason": "typed"}
    assert (await admin.get("/ui/session")).json() == {"csrf": csrf}
    elsewhere.cookies.set("qoss_session", admin.cookies["qoss_session"])  # the same session, signed out elsewhere
    assert (await elsewhere.post("/ui/logout", data={"csrf": csrf})).status_code == 303
    ended = await admin.post(f"{row}/preview", headers=HTMX, data=typed)
    assert (ended.status_code, ended.headers["hx-reswap"]) == (401, "none")
    assert "hx-redirect" not in ended.headers
    assert SESSION_ENDED.search(ended.text), ended.text
    assert ended.headers["content-security-policy"].startswith("default-src 'none'")
    refreshed = await admin.get("/ui/session", headers=HTMX)  # what session.js asks before sending again
    assert refreshed.status_code == 401 and SESSION_ENDED.search(refreshed.text)  # noqa: PT018
    page = await admin.get("/ui/tables/esaf-2006")  # a whole page: the sign-in page, as before
    assert (page.status_code, page.headers["location"]) == (303, "/ui/login")
    # signed in again (another tab: the same cookies), the page's form is sent with the new session's token
    again = await sign_in(admin, token("editor-again"))
    assert again != csrf
    assert (await admin.get("/ui/session")).json() == {"csrf": again}
    assert (await admin.post(f"{row}/preview", headers=HTMX, data=typed)).status_code == 403  # the old token
    previewed = await admin.post(f"{row}/preview", headers=HTMX, data={**typed, "csrf": again})
    assert previewed.status_code == 200 and 'class="preview"' in previewed.text  # noqa: PT018


async def test_sign_in_sets_a_strict_httponly_session_cookie_and_stores_only_its_hash(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client = browser()
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", data={"csrf": csrf_of(form.text), "token": token()})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/tables")
    cookie = _cookie_header(answer, "qoss_session")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "max-age", "path"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()  # noqa: PT018
    assert "secure" not in attributes  # plain HTTP: a Secure cookie would never come back
    session_id = client.cookies["qoss_session"]
    assert _session_hashes(settings) == [hashlib.sha256(session_id.encode()).hexdigest()]
    page = await client.get("/ui/tables")
    assert page.status_code == 200 and "editor" in page.text  # noqa: PT018


async def test_the_cookie_is_secure_when_a_trusted_proxy_says_the_client_used_tls(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    tls = {"X-Forwarded-Proto": "https"}
    form = await client.get("/ui/login", headers=tls)
    assert "secure" in _cookie_header(form, "__Host-qoss_login").lower()
    nonce = form.cookies["__Host-qoss_login"]  # a client sends a Secure cookie over TLS only: by hand here
    answer = await client.post("/ui/login", headers={**tls, "Cookie": f"__Host-qoss_login={nonce}"},
                               data={"csrf": nonce, "token": token()})
    assert answer.status_code == 303
    assert "; secure" in _cookie_header(answer, "qoss_session").lower()


async def test_a_wrong_token_opens_no_session(browser: Browser, settings: Settings) -> None:
    client = browser()
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", data={"csrf": csrf_of(form.text),
                                                  "token": "qoss_0123456789ab_" + "A" * 43})
    assert answer.status_code == 401
    assert "not accepted" in answer.text
    assert "qoss_session" not in answer.cookies
    assert _session_hashes(settings) == []


async def test_sign_in_without_its_csrf_value_is_refused(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await client.get("/ui/login")
    answer = await client.post("/ui/login", data={"csrf": "forged", "token": token()})
    assert answer.status_code == 403
    other = browser()  # a form posted from another site: no qoss_login cookie at all
    answer = await other.post("/ui/login", data={"csrf": "x", "token": token()})
    assert answer.status_code == 403
    assert "qoss_session" not in answer.cookies


async def test_revoking_the_token_ends_its_sessions_at_once(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client = browser()
    secret = token("revoked-soon")
    await sign_in(client, secret)
    admin = browser()
    token_id = secret.split("_")[1]
    boss = {"Authorization": f"Bearer {token('boss', ['admin'])}"}
    revoked = await admin.delete(f"/v1/tokens/{token_id}", headers=boss)
    assert revoked.status_code == 204  # through the service: its caches forget the token at once
    answer = await client.get("/ui/tables")
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login")


async def test_a_revocation_by_another_process_ends_its_sessions_within_the_token_cache_ttl(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client = browser()
    await sign_in(client, token("revoked-soon"))
    engine = make_engine(settings.database_url)  # qoss token revoke beside the server, as another process would
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            token_id = next(t.id for t in uow.tokens.list() if t.name == "revoked-soon")
            revoke_token(uow=uow, token_id=token_id, audit=False)
            uow.commit()
    finally:
        engine.dispose()
    # SQLite: within QOSS_TOKEN_CACHE_TTL (1 s); PostgreSQL: at once, by the replicas' change notices
    deadline = asyncio.get_running_loop().time() + 3.0
    while (answer := await client.get("/ui/tables")).status_code == 200 and \
            asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login")


async def test_logout_ends_the_session_and_needs_the_csrf_token(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    refused = await client.post("/ui/logout", data={})
    assert refused.status_code == 403
    assert len(_session_hashes(settings)) == 1
    answer = await client.post("/ui/logout", data={"csrf": csrf})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login")
    assert _session_hashes(settings) == []
    assert (await client.get("/ui/tables")).status_code == 303


@pytest.mark.parametrize("path", ["/ui/login", "/ui/tables", "/ui/static/console.css"])
async def test_console_answers_carry_a_strict_content_security_policy(
        browser: Browser, token: Callable[..., str], path: str) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get(path)
    assert answer.status_code == 200
    csp = answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp  # noqa: PT018
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp  # noqa: PT018
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["x-content-type-options"] == "nosniff"


async def test_a_page_holds_no_inline_script(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("admin", ["admin"]))
    for path in ("/ui/tables", "/ui/tables/esaf-2006", "/ui/negotiate?run=true&p1=a&p1c=8&why=sha256",
                 "/ui/policies/voip", "/ui/tunnels", "/ui/agent", "/ui/measurements", "/ui/tokens",
                 "/ui/gateways", "/ui/audit"):
        html = (await client.get(path)).text
        scripts = re.findall(r"<script[^>]*>", html)
        assert scripts == [f'<script src="/ui/static/{js}" defer>'
                           for js in ("htmx.min.js", "live.js", "keys.js", "grid.js", "session.js")], path
        assert re.findall(r"<script[^>]*>(.*?)</script>", html, re.DOTALL) == [""] * 5, path  # nothing inline
        assert not re.search(r"<[^>]+\son[a-z]+\s*=", html, re.IGNORECASE), path  # no inline event handler


async def test_sign_in_and_refusals_are_audited(browser: Browser, token: Callable[..., str], app: Any) -> None:
    client = browser()
    await sign_in(client, token("auditor-check"))
    await client.post("/ui/logout", data={})  # refused: no CSRF token
    await asyncio.to_thread(app.state.runtime.auditor.flush)  # never on the event loop
    engine = make_engine(app.state.runtime.settings.database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            records = uow.audit.list(limit=10)
    finally:
        engine.dispose()
    seen = {(r["object"], r["outcome"], r["token_name"]) for r in records}
    assert ("/ui/login", 303, "auditor-check") in seen
    assert ("/ui/logout", 403, "auditor-check") in seen
