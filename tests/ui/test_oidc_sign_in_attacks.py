"""Signing in with the identity provider, attacked against a real ``qoss serve`` on SQLite:

- anonymous sign-ins waiting on a provider that accepts connections and never answers hold no
  write lock: an admin's change goes through while they wait, and an answer already taken is
  refused without asking the provider again;
- a flow cookie planted in a victim's browser from a sibling origin (login CSRF through the
  callback), with the attacker's own code and state from a real provider (zitadel/oidc's
  example OP, :mod:`tests.fixtures.oidc_provider`), does not sign the victim in.
"""

from __future__ import annotations

import html
import logging
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.bootstrap import prepare_database
from app.domain.oidc import new_flow
from app.services.console_oidc import flow_key
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.figures import figure
from tests.fixtures.oidc_provider import OidcUser, RunningProvider, build_provider, running_provider
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.served import free_port, serving

QOSS = Path(sys.executable).parent / "qoss"
MAPPING = '{"groups": {"qoss-admins": ["admin"]}}'
MALLORY = OidcUser("u-mallory", "mallory", "mallory-pw-5521", "mallory@example.test", ("qoss-admins",))
CLIENT_SECRET = "qoss-console-secret-attacks-9e2b"
#: Concurrent anonymous sign-ins (each waits on the provider; at most QOSS_OIDC_CALLS_IN_FLIGHT, 8).
WAITING = 6


@dataclass(frozen=True)
class Console:
    base: str
    database_url: str
    admin: str

    @property
    def origin(self) -> dict[str, str]:
        """What a browser sends with a form posted from the console's own pages."""
        return {"Origin": self.base}


class NeverAnswers:
    """A provider on loopback that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/"

    @property
    def connections(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(connection)

    def wait_for(self, count: int, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while self.connections < count:
            assert time.monotonic() < deadline, f"{self.connections} of {count} sign-ins reached the provider"
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for connection in self._held:
            connection.close()


@contextmanager
def _console(workdir: Path, issuer: str, name: str, **env: str) -> Iterator[Console]:
    url = f"sqlite:///{workdir / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    port = free_port()
    full = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
            "QOSS_STATE_DIR": str(workdir / "state"), "QOSS_OIDC_ISSUER": issuer,
            "QOSS_OIDC_CLIENT_ID": "qoss-console", "QOSS_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "QOSS_OIDC_SCOPES_BY_CLAIM": MAPPING,
            "QOSS_OIDC_REDIRECT_URL": f"http://127.0.0.1:{port}/ui/oidc/callback",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p), **env}
    register(CLIENT_SECRET)
    try:
        with serving([str(QOSS), "serve", "--database-url", url], env=full, log=workdir / f"{name}.log",
                     port=port) as (base, _):
            yield Console(base, url, make_token(url, "admin", ["admin"]))
    finally:
        keep_log(workdir / f"{name}.log", f"{name}.log")
        keep_log(workdir / "qoss.db", f"{name}-qoss.db")


def _binding() -> str:
    """What the sign-in page's script makes and keeps in the tab's sessionStorage."""
    return secrets.token_urlsafe(32)


def _session_cookies(answer: httpx.Response) -> list[str]:
    return [c for c in answer.headers.get_list("set-cookie") if c.startswith("qoss_session=")]


@pytest.fixture(autouse=True)
def _client_logs_quiet() -> Iterator[None]:
    """This test's own HTTP client logs each URL and header it sends and gets (the provider's
    code, the session cookie): not in the logs the secret sweep searches for what qoss leaks."""
    loggers = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# --- a provider that never answers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hung() -> Iterator[NeverAnswers]:
    provider = NeverAnswers()
    try:
        yield provider
    finally:
        provider.close()


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory, hung: NeverAnswers) -> Iterator[Console]:
    """A console whose provider never answers (each request to it given 5 s)."""
    with _console(tmp_path_factory.mktemp("oidc-hung"), hung.issuer, "serve-hung", QOSS_OIDC_TIMEOUT="5") as console:
        yield console


def _admin_write_while(console: Console, hung: NeverAnswers, sign_ins: list[tuple[str, dict[str, str],
                       dict[str, str]]]) -> tuple[float, float, list[httpx.Response]]:
    """Send ``sign_ins`` (path, form, cookies) at once; once each is waiting on the provider, an
    admin's ``POST /v1/tokens``. Returns how long the admin's change took, how long after it
    the first sign-in was answered, and the sign-ins' answers."""
    before = hung.connections

    def sign_in(path: str, form: dict[str, str], cookies: dict[str, str]) -> tuple[httpx.Response, float]:
        with httpx.Client(base_url=console.base, cookies=cookies, timeout=60) as anonymous:
            answer = anonymous.post(path, data=form, headers=console.origin)
        return answer, time.monotonic()

    with ThreadPoolExecutor(len(sign_ins)) as pool:
        waiting = [pool.submit(sign_in, *s) for s in sign_ins]
        hung.wait_for(before + len(sign_ins))  # every one of them is asking the provider now
        began = time.monotonic()
        created = httpx.post(f"{console.base}/v1/tokens", json={"name": f"ci-{began:.0f}", "scopes": ["tunnels:read"]},
                             headers={"Authorization": f"Bearer {console.admin}"}, timeout=60)
        done = time.monotonic()
        assert created.status_code == 201, created.text
        register(created.json()["token"])
        answers = [w.result(timeout=60) for w in waiting]
    return done - began, min(at for _, at in answers) - done, [a for a, _ in answers]


def test_sign_ins_waiting_on_a_provider_that_never_answers_do_not_hold_up_an_admins_change(
        stalled: Console, hung: NeverAnswers) -> None:
    took, then, answers = _admin_write_while(
        stalled, hung, [("/ui/oidc/start", {"binding": _binding()}, {}) for _ in range(WAITING)])
    assert [a.status_code for a in answers] == [502] * WAITING  # each asked the provider, and gave up
    assert all("does not answer" in html.unescape(a.text) for a in answers)
    assert then > 0  # the admin's change was answered while every sign-in still waited
    figure("oidc starts waiting on a silent provider", f"an admin's POST /v1/tokens took {took:.3f} s behind {WAITING}")
    assert took < 1.0, f"the admin's change took {took:.2f} s behind {WAITING} sign-ins"


def test_callbacks_waiting_on_the_provider_do_not_hold_up_an_admins_change_and_a_replay_is_refused_unasked(
        stalled: Console, hung: NeverAnswers) -> None:
    engine = make_engine(stalled.database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            key = flow_key(uow)  # the attacker cannot read it; minting valid flows stands for a slow provider
            uow.commit()
    finally:
        engine.dispose()
    flows = []
    for _ in range(WAITING):
        binding = _binding()
        cookie, flow = new_flow(key, binding=binding, now=time.time())
        flows.append(("/ui/oidc/callback", {"code": "c0de", "state": flow.state, "binding": binding},
                      {"qoss_oidc": cookie}))
    took, then, answers = _admin_write_while(stalled, hung, flows)
    assert [a.status_code for a in answers] == [502] * WAITING
    assert then > 0
    figure("oidc callbacks waiting on a silent provider",
           f"an admin's POST /v1/tokens took {took:.3f} s behind {WAITING}")
    assert took < 1.0, f"the admin's change took {took:.2f} s behind {WAITING} callbacks"

    asked = hung.connections
    path, form, cookies = flows[0]
    with httpx.Client(base_url=stalled.base, cookies=cookies, timeout=60) as replaying:
        replayed = replaying.post(path, data=form, headers=stalled.origin)
    assert replayed.status_code == 401
    assert "answered already" in html.unescape(replayed.text)
    assert hung.connections == asked  # refused before the provider was asked
    assert not _session_cookies(replayed)


# --- login CSRF through the callback, with a real provider ------------------------------------------


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProvider]:
    workdir = tmp_path_factory.mktemp("oidc-op-attacks")
    with running_provider(build_provider(), users=[MALLORY], client_id="qoss-console", client_secret=CLIENT_SECRET,
                          redirect_uris=["http://127.0.0.1:*/ui/oidc/callback"],
                          post_logout_redirect_uris=["http://127.0.0.1:*/ui/login"], workdir=workdir) as running:
        yield running
    keep_log(workdir / "oidc-op.log", "oidc-op-attacks.log")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, provider: RunningProvider) -> Iterator[Console]:
    with _console(tmp_path_factory.mktemp("oidc-csrf"), provider.issuer, "serve-csrf") as served:
        yield served


def test_the_redirect_uri_is_the_configured_one_whatever_the_host_header_says(console: Console) -> None:
    with httpx.Client(base_url=console.base, timeout=30) as client:
        started = client.post("/ui/oidc/start", data={"binding": _binding()},
                              headers={**console.origin, "Host": "evil.example"})
    assert started.status_code == 200, started.text
    authorize = html.unescape(re.search(r'url=([^"]+)"', started.text).group(1))  # type: ignore[union-attr]
    assert parse_qs(urlsplit(authorize).query)["redirect_uri"] == [f"{console.base}/ui/oidc/callback"]


def test_a_sign_in_starts_only_from_the_console_sign_in_page(console: Console) -> None:
    with httpx.Client(base_url=console.base, timeout=30) as client:
        linked = client.get("/ui/oidc/start")  # an old bookmark, or a link on another site
        assert (linked.status_code, linked.headers["location"]) == (303, "/ui/login")
        elsewhere = client.post("/ui/oidc/start", data={"binding": _binding()},
                                headers={"Origin": f"http://127.0.0.1:{free_port()}"})
        assert elsewhere.status_code == 403
        unbound = client.post("/ui/oidc/start", data={"binding": "chosen-by-the-page"}, headers=console.origin)
        assert unbound.status_code == 400
        assert "qoss_oidc" not in client.cookies


@dataclass(frozen=True)
class _Started:
    """What the attacker holds after signing in at the provider and stopping before the callback."""

    cookie: str
    binding: str
    code: str
    state: str


def _sign_in_at_the_provider_and_stop(console: Console, user: OidcUser) -> _Started:
    binding = _binding()
    with httpx.Client(base_url=console.base, timeout=30) as attacker:
        started = attacker.post("/ui/oidc/start", data={"binding": binding}, headers=console.origin)
        assert started.status_code == 200, started.text
        cookie = attacker.cookies["qoss_oidc"]
        authorize = html.unescape(re.search(r'url=([^"]+)"', started.text).group(1))  # type: ignore[union-attr]
    with httpx.Client(timeout=30, follow_redirects=False) as browser:
        answer = browser.get(authorize)
        for _ in range(5):  # on to the provider's login form
            if answer.status_code not in (302, 303):
                break
            answer = browser.get(httpx.URL(str(answer.url)).join(answer.headers["location"]))
        request_id = parse_qs(urlsplit(str(answer.url)).query)["authRequestID"][0]
        answer = browser.post(httpx.URL(str(answer.url)).join("/login/username"),
                              data={"id": request_id, "username": user.username, "password": user.password})
        for _ in range(5):  # the provider's redirects, up to the console's callback (not followed)
            location = answer.headers.get("location", "")
            if "/ui/oidc/callback" in location:
                break
            answer = browser.get(httpx.URL(str(answer.url)).join(location))
        query = parse_qs(urlsplit(location).query)
    code, state = query["code"][0], query["state"][0]
    register(code)
    return _Started(cookie, binding, code, state)


def test_a_flow_cookie_planted_in_a_victims_browser_does_not_sign_the_victim_in(console: Console) -> None:
    mallory = _sign_in_at_the_provider_and_stop(console, MALLORY)
    callback = {"code": mallory.code, "state": mallory.state}
    planted = {"qoss_oidc": mallory.cookie}  # a sibling origin can set it for this host

    with httpx.Client(base_url=console.base, cookies=planted, timeout=30) as victim:
        arrived = victim.get("/ui/oidc/callback", params=callback)  # sent there by the attacker
        assert arrived.status_code == 200
        assert not _session_cookies(arrived)
        # the callback page posts on with what this tab's sessionStorage holds: nothing, or the
        # binding of a sign-in of the victim's own
        for binding in ("", _binding()):
            answer = victim.post("/ui/oidc/callback", data={**callback, "binding": binding}, headers=console.origin)
            assert answer.status_code == 401
            assert not _session_cookies(answer)
        # a page of another origin posting the attacker's binding
        other = f"http://127.0.0.1:{free_port()}"
        answer = victim.post("/ui/oidc/callback", data={**callback, "binding": mallory.binding},
                             headers={"Origin": other})
        assert answer.status_code == 403
        assert not _session_cookies(answer)
        assert victim.get("/ui/tables", follow_redirects=False).status_code == 303  # still signed out

    # the attacker's own tab, with its binding, completes: the code and state were good
    with httpx.Client(base_url=console.base, cookies=planted, timeout=30) as attacker:
        answer = attacker.post("/ui/oidc/callback", data={**callback, "binding": mallory.binding},
                               headers=console.origin)
        assert answer.status_code == 200, answer.text
        assert _session_cookies(answer)
        register(attacker.cookies["qoss_session"])
        assert "oidc:mallory@example.test" in answer.text
        replayed = attacker.post("/ui/oidc/callback", data={**callback, "binding": mallory.binding},
                                 headers=console.origin)
        assert replayed.status_code == 401
        assert not _session_cookies(replayed)
