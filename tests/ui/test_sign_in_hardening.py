"""Signing in from another origin of the same host, and forms the console refuses to read."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.main import create_app
from app.settings import Settings
from app.ui import session
from tests.ui.conftest import csrf_of, sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
_TLS = {"X-Forwarded-Proto": "https"}  # the tests' settings trust 127.0.0.1, the test client's address


def _set_cookies(answer: httpx.Response) -> list[str]:
    return answer.headers.get_list("set-cookie")


def _no_session(answer: httpx.Response) -> None:
    assert not [c for c in _set_cookies(answer) if c.startswith("qoss_session=")], _set_cookies(answer)


def _login_key(settings: Settings) -> bytes:
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            value = conn.execute(text("SELECT value FROM server_keys WHERE name = 'console-login'")).scalar_one()
    finally:
        engine.dispose()
    return bytes.fromhex(value)


def _nested_multipart(depth: int) -> tuple[str, bytes]:
    """A form whose one field is a ``multipart/mixed`` part nested ``depth`` deep."""
    content, kind = b"leaf", "text/plain"
    for level in range(1, depth + 1):
        boundary = f"b{level}".encode()
        content = (b"--" + boundary + b"\r\nContent-Type: " + kind.encode() + b"\r\n\r\n" + content
                   + b"\r\n--" + boundary + b"--\r\n")
        kind = f"multipart/mixed; boundary=b{level}"
    body = (b'--top\r\nContent-Disposition: form-data; name="file"; filename="t.yaml"\r\nContent-Type: '
            + kind.encode() + b"\r\n\r\n" + content + b"\r\n--top--\r\n")
    return "multipart/form-data; boundary=top", body


def _big_multipart(size: int) -> tuple[str, bytes]:
    head = b'--big\r\nContent-Disposition: form-data; name="token"\r\n\r\n'
    tail = b"\r\n--big--\r\n"
    return "multipart/form-data; boundary=big", head + b"A" * (size - len(head) - len(tail)) + tail


# --- login CSRF: cookie tossing, another origin ------------------------------------------------------


async def test_a_tossed_login_cookie_with_a_nonce_this_server_never_made_is_refused(
        browser: Browser, token: Callable[..., str]) -> None:
    victim = browser()
    attacker_nonce = "attacker-chosen-nonce-0123456789"  # set by a page on another port of this host
    answer = await victim.post("/ui/login", headers={"Cookie": f"qoss_login={attacker_nonce}"},
                               data={"csrf": attacker_nonce, "token": token("attacker")})
    assert answer.status_code == 403
    _no_session(answer)


async def test_a_forged_nonce_of_the_right_shape_is_refused(browser: Browser, token: Callable[..., str]) -> None:
    victim = browser()
    form = await victim.get("/ui/login")
    minted = csrf_of(form.text)
    random, expires, _ = minted.split(".")
    forged = f"{random}.{expires}.{'A' * 43}"
    answer = await victim.post("/ui/login", headers={"Cookie": f"qoss_login={forged}"},
                               data={"csrf": forged, "token": token("attacker")})
    assert answer.status_code == 403
    _no_session(answer)


async def test_a_sign_in_nonce_older_than_its_lifetime_is_refused(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    client, editor = browser(), token()
    await client.get("/ui/login")  # the server makes its key
    stale = session.new_login_nonce(_login_key(settings), now=time.time() - 901)
    answer = await client.post("/ui/login", headers={"Cookie": f"qoss_login={stale}"},
                               data={"csrf": stale, "token": editor})
    assert answer.status_code == 403
    _no_session(answer)
    fresh = session.new_login_nonce(_login_key(settings))
    answer = await client.post("/ui/login", headers={"Cookie": f"qoss_login={fresh}"},
                               data={"csrf": fresh, "token": editor})
    assert answer.status_code == 303


@pytest.mark.parametrize("headers", [
    {"Origin": "http://qoss.test:8081"},  # another port of the same host: same site, not same origin
    {"Origin": "https://qoss.test"},
    {"Origin": "http://evil.test"},
    {"Origin": "null"},
    {"Referer": "http://qoss.test:8081/toss.html"},
], ids=["other-port", "other-scheme", "other-host", "null", "referer-only"])
async def test_sign_in_posted_from_another_origin_is_refused(
        browser: Browser, token: Callable[..., str], headers: dict[str, str]) -> None:
    client = browser()  # the attacker's own valid nonce (a GET of the form), tossed into the victim's browser
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", headers=headers, data={"csrf": csrf_of(form.text), "token": token()})
    assert answer.status_code == 403
    _no_session(answer)


@pytest.mark.parametrize("headers", [
    {"Origin": "http://qoss.test"},
    {"Origin": "http://QOSS.test:80"},
    {"Referer": "http://qoss.test/ui/login"},
    {},
], ids=["origin", "origin-default-port", "referer", "neither"])
async def test_sign_in_from_the_console_itself_still_works(
        browser: Browser, token: Callable[..., str], headers: dict[str, str]) -> None:
    client = browser()
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", headers=headers, data={"csrf": csrf_of(form.text), "token": token()})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/tables")
    assert (await client.get("/ui/tables")).status_code == 200


async def test_a_configured_public_origin_may_post_the_sign_in_form(
        settings: Settings, token: Callable[..., str]) -> None:
    """Behind a proxy that rewrites Host, the console's public address is configured."""
    application = create_app(settings.model_copy(update={"console_origins": ["https://console.example.net"]}))
    answers = []
    async with application.router.lifespan_context(application):
        editor = token()
        for sent_from in ("https://console.example.net", "https://other.example.net"):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                         base_url="http://qoss.test") as client:
                form = await client.get("/ui/login")
                answers.append(await client.post("/ui/login", headers={"Origin": sent_from},
                                                 data={"csrf": csrf_of(form.text), "token": editor}))
    assert [a.status_code for a in answers] == [303, 403]


def test_a_console_origin_must_be_an_origin() -> None:
    with pytest.raises(ValueError, match="console_origins"):
        Settings(console_origins="https://console.example.net/ui")
    assert Settings(console_origins="https://Console.example.net, http://10.0.0.5:8080").console_origins == [
        "https://console.example.net:443", "http://10.0.0.5:8080"]


async def test_over_tls_the_sign_in_cookie_is_host_prefixed_and_a_plain_one_is_not_taken(
        browser: Browser, token: Callable[..., str]) -> None:
    client, editor = browser(), token()
    form = await client.get("/ui/login", headers=_TLS)
    cookie = next(c for c in _set_cookies(form) if c.startswith("__Host-qoss_login="))
    attributes = [part.strip().lower() for part in cookie.split(";")]
    assert "secure" in attributes and "path=/" in attributes  # noqa: PT018 - what __Host- requires
    assert not [a for a in attributes if a.startswith("domain")]
    nonce = csrf_of(form.text)
    tossed = await client.post("/ui/login", headers={**_TLS, "Cookie": f"qoss_login={nonce}"},
                               data={"csrf": nonce, "token": editor})
    assert tossed.status_code == 403  # a cookie without the prefix could come from plain HTTP
    _no_session(tossed)
    answer = await client.post("/ui/login", headers={**_TLS, "Cookie": f"__Host-qoss_login={nonce}"},
                               data={"csrf": nonce, "token": editor})
    assert answer.status_code == 303
    assert any(c.startswith("__Host-qoss_login=") and "max-age=0" in c.lower() for c in _set_cookies(answer))


# --- forms the console refuses to read ---------------------------------------------------------------


@pytest.fixture
async def full_size(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client on an app whose body cap is above the console's own limits (the tests' settings have a
    smaller one)."""
    application = create_app(settings.model_copy(update={"max_body_bytes": 2 * 1_048_576}))
    async with application.router.lifespan_context(application), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://qoss.test") as client:
        yield client


async def test_a_multipart_sign_in_is_refused_unread(browser: Browser) -> None:
    kind, body = _nested_multipart(1000)
    answer = await browser().post("/ui/login", headers={"Content-Type": kind}, content=body)
    assert answer.status_code == 415
    assert "application/x-www-form-urlencoded" in answer.text


async def test_a_1_mb_multipart_sign_in_is_refused(full_size: httpx.AsyncClient) -> None:
    kind, body = _big_multipart(1_000_000)
    answer = await full_size.post("/ui/login", headers={"Content-Type": kind}, content=body)
    assert answer.status_code == 415
    _no_session(answer)


async def test_a_large_urlencoded_sign_in_is_413(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    form = await client.get("/ui/login")
    answer = await client.post("/ui/login", data={"csrf": csrf_of(form.text), "token": token(), "pad": "x" * 20000})
    assert answer.status_code == 413
    _no_session(answer)


async def test_a_nested_multipart_form_is_refused_not_a_500(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    kind, body = _nested_multipart(1000)
    answer = await client.post("/ui/tables/import", headers={"Content-Type": kind, "X-CSRF-Token": csrf},
                               content=body)
    assert answer.status_code == 415
    assert "multipart" in answer.text


async def test_a_multipart_form_over_the_upload_limit_is_413(
        full_size: httpx.AsyncClient, token: Callable[..., str]) -> None:
    csrf = await sign_in(full_size, token())
    kind, body = _big_multipart(1_048_577)
    answer = await full_size.post("/ui/tables/import", headers={"Content-Type": kind, "X-CSRF-Token": csrf},
                                  content=body)
    assert answer.status_code == 413


@pytest.mark.parametrize(("kind", "body", "status"), [
    ("multipart/form-data", b"--x\r\n\r\nx\r\n--x--\r\n", 400),  # no boundary
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nno end', 400),
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="a"', 400),
    ("multipart/form-data; boundary=x",
     b"".join(b'--x\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(65)) + b"--x--\r\n",
     413),
    ("multipart/form-data; boundary=x",
     b'--x\r\nContent-Disposition: form-data; name="a"\r\nContent-Transfer-Encoding: base64\r\n\r\n!!!\r\n--x--\r\n',
     400),
    ("application/x-www-form-urlencoded", b"&".join(b"f%d=v" % i for i in range(65)), 413),
    ("application/x-www-form-urlencoded", b"csrf=\xff", 400),
], ids=["no-boundary", "no-close", "no-body", "too-many-parts", "bad-base64", "too-many-fields", "not-utf8"])
async def test_a_malformed_form_is_a_clear_4xx(
        browser: Browser, token: Callable[..., str], kind: str, body: bytes, status: int) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    answer = await client.post("/ui/tables/import", headers={"Content-Type": kind, "X-CSRF-Token": csrf},
                               content=body)
    assert answer.status_code == status, answer.text
    assert "Internal" not in answer.text


async def test_an_upload_still_reads_as_text(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    body = (b'--x\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n' + csrf.encode()
            + b'\r\n--x\r\nContent-Disposition: form-data; name="file"; filename="t.yaml"\r\n'
            b"Content-Type: application/yaml\r\n\r\nnot: [a table\r\n--x--\r\n")
    answer = await client.post("/ui/tables/import", headers={"Content-Type": "multipart/form-data; boundary=x"},
                               content=body)
    assert answer.status_code == 422  # read, CSRF held, then the YAML was refused
    assert "Nothing imported" in answer.text


async def test_a_multipart_form_is_read_off_the_event_loop(
        browser: Browser, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    loop_thread = threading.get_ident()
    assert asyncio.get_running_loop()
    seen: list[int] = []
    real = session._multipart

    def watched(*args: Any) -> Any:
        seen.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(session, "_multipart", watched)
    answer = await client.post("/ui/tables/import", headers={"X-CSRF-Token": csrf},
                               files={"file": ("t.yaml", b"name: x\n", "application/yaml")})
    assert answer.status_code == 422
    assert seen and loop_thread not in seen  # noqa: PT018


# --- guessing tokens at the sign-in form ----------------------------------------------------------------------


async def test_guessing_tokens_at_the_sign_in_form_is_held_to_the_failed_check_limit(
        token: Callable[..., str], settings: Settings) -> None:
    """The sign-in form checks a token as the API does: past ``auth_failure_burst`` failures from
    one address, a sign-in is 429 before its token is looked up, a good token included. (The
    budget refills slowly here, so a slow machine's pace cannot refill it between the guesses.)"""
    good = token("owner")
    application = create_app(settings.model_copy(update={"auth_failure_rate": 0.01}))
    async with application.router.lifespan_context(application), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://qoss.test") as guesser:
        statuses = []
        for n in range(settings.auth_failure_burst + 3):
            form = await guesser.get("/ui/login")
            answer = await guesser.post("/ui/login", data={"csrf": csrf_of(form.text), "token": f"qoss_guess{n}"})
            statuses.append(answer.status_code)
            _no_session(answer)
        assert statuses[:settings.auth_failure_burst] == [401] * settings.auth_failure_burst
        assert statuses[-1] == 429
        form = await guesser.get("/ui/login")
        answer = await guesser.post("/ui/login", data={"csrf": csrf_of(form.text), "token": good})
        assert answer.status_code == 429
        _no_session(answer)
