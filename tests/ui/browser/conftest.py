"""A real ``qoss serve`` and Debian's headless chromium driven by Playwright (no browser
download: ``scripts/setup.sh`` installs ``chromium``); an OpenID provider (zitadel/oidc's example
OP, built by the suite: :mod:`tests.fixtures.oidc_provider`) for the consoles that sign in with it.

Screenshots of the main pages go to ``$QOSS_UI_SCREENSHOTS`` if set (``docs/ui/`` keeps the
best), else to the test session's temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from playwright.sync_api import Browser, BrowserContext, Page, Request, sync_playwright

from app.bootstrap import prepare_database
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import agent_server_config
from tests.fixtures.oidc_provider import OidcUser, RunningProvider, build_provider, running_provider
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.served import free_port, serving

QOSS = Path(sys.executable).parent / "qoss"


#: What the ``new_context`` fixture gives: a fresh browser context (cookies of its own).
NewContext = Callable[..., BrowserContext]


class Served:
    """The served console: its base URL, its database and a token per role."""

    def __init__(self, base: str, database_url: str) -> None:
        self.base = base
        self.database_url = database_url
        self.editor = make_token(database_url, "editor", ["ratings:write"])
        self.other_editor = make_token(database_url, "other-editor", ["ratings:write"])
        self.reader = make_token(database_url, "reader", ["tunnels:read"])
        self.admin = make_token(database_url, "admin", ["admin"])


def database_at(where: Path) -> str:
    """The URL of a migrated SQLite database under ``where``."""
    url = f"sqlite:///{where / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    return url


def serve_env(where: Path, **more: str) -> dict[str, str]:
    """The environment of a served qoss: no tunnel monitor, no reconcile at the start, its state
    under ``where``, the code under test on the path; ``more`` besides."""
    return {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
            "QOSS_STATE_DIR": str(where / "state"),
            # the code under test, wherever the interpreter's own install of qoss points
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p), **more}


@contextlib.contextmanager
def serving_qoss(where: Path, database_url: str, env: Mapping[str, str], name: str) -> Iterator[str]:
    """``qoss serve`` on ``database_url`` with ``env``: its base URL. Its log and database are kept
    (``<name>-serve.log``, ``<name>-qoss.db``) however it ends."""
    try:
        with serving([str(QOSS), "serve", "--database-url", database_url], env=env,
                     log=where / "serve.log") as (base, _):
            yield base
    finally:
        keep_log(where / "serve.log", f"{name}-serve.log")
        keep_log(where / "qoss.db", f"{name}-qoss.db")


def host_config(where: Path, *, pool: str | None = None) -> tuple[Path, Path]:
    """An ``agent.yaml`` under ``where`` for Host and Target in one process, Target's charon at
    ``where/sockets/charon.vici`` (and its address pool ``pool``): the config and the socket."""
    config, _ = agent_server_config(where)
    socket_path = where / "sockets" / "charon.vici"
    doc = yaml.safe_load(config.read_text())
    doc["target"]["vici_socket"] = str(socket_path)
    if pool is not None:
        doc["target"]["pool"] = pool
    config.write_text(yaml.safe_dump(doc))
    return config, socket_path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("served-console")
    url = database_at(where)
    bench = where / "bench"
    bench.mkdir()
    shutil.copy(REPO_ROOT / "docs" / "measurements" / "micro.json", bench / "micro.json")
    env = serve_env(where, QOSS_MEASUREMENTS_DIR=str(bench), QOSS_EVENT_STREAM_SECONDS="30")
    with serving_qoss(where, url, env, "console") as base:
        yield Served(base, url)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: run scripts/setup.sh (Debian's chromium package)", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def new_context(chromium: Browser) -> Iterator[NewContext]:
    """Browser contexts (each its own cookies: a second browser), closed after the test."""
    contexts: list[BrowserContext] = []

    def make(**options: object) -> BrowserContext:
        context = chromium.new_context(**{"viewport": {"width": 1280, "height": 800}, **options})  # type: ignore[arg-type]
        contexts.append(context)
        return context

    yield make
    for context in contexts:
        context.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("QOSS_UI_SCREENSHOTS")
    path = Path(wanted) if wanted else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _expected(message: str) -> bool:
    """Chromium logs every 4xx answer; a refusal, a conflict or a session that ended (401) is what
    some steps expect."""
    return re.fullmatch(r"Failed to load resource: the server responded with a status of (401|403|409|422) .*",
                        message) is not None


class Watched:
    """A page whose CSP violations, script errors and dialogs (an XSS would open one) are kept."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.problems: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", lambda m: self.problems.append(m.text) if m.type == "error" and not _expected(m.text)
                else None)
        page.on("pageerror", lambda e: self.problems.append(str(e)))
        page.on("dialog", self._dialog)

    def _dialog(self, dialog: object) -> None:
        self.dialogs.append(getattr(dialog, "message", ""))
        dialog.dismiss()  # type: ignore[attr-defined]


def no_trouble(*watched: Watched) -> None:
    """Fail if any watched page had a CSP violation, a script error or a dialog."""
    for w in watched:
        assert not w.problems, w.problems
        assert not w.dialogs, w.dialogs


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/ui/tables$"))
    for cookie in page.context.cookies():
        if cookie.get("name") == "qoss_session":
            register(cookie.get("value", ""))  # the secret sweep: never in the database or the server's log


def save_previewed(page: Page, keyword: str) -> None:
    """Save the row being edited the way an admin does: **Preview**, then **Save** under its impact."""
    page.locator(f"#row-{keyword}").get_by_role("button", name="Preview").click()
    page.locator(f"#row-{keyword}.preview").get_by_role("button", name=f"Save {keyword}").click()


# ------------------------------------------------------------------ signing in with an OpenID provider

ALICE = OidcUser("u-alice", "alice", "alice-pw-4471", "alice@example.test", ("qoss-admins", "staff"))
BOB = OidcUser("u-bob", "bob", "bob-pw-9130", "bob@example.test", ("netops", "staff"))
CAROL = OidcUser("u-carol", "carol", "carol-pw-2208", "carol@example.test", ("contractors",))
#: The provider's groups mapped to qoss scopes (``QOSS_OIDC_SCOPES_BY_CLAIM``).
MAPPING = {"groups": {"qoss-admins": ["admin"], "netops": ["tunnels:read"]}}
CLIENT_SECRET = "qoss-console-secret-6f1d0c3b9a"


@pytest.fixture(scope="session")
def provider_binary() -> Path:
    return build_provider()


@pytest.fixture(scope="session")
def provider(provider_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProvider]:
    """The OpenID provider with ALICE, BOB and CAROL, for any console on 127.0.0.1 (any port)."""
    workdir = tmp_path_factory.mktemp("oidc-op")
    register(CLIENT_SECRET)  # the secret sweep: never in the database or a log
    with running_provider(provider_binary, users=[ALICE, BOB, CAROL], client_id="qoss-console",
                          client_secret=CLIENT_SECRET, redirect_uris=["http://127.0.0.1:*/ui/oidc/callback"],
                          post_logout_redirect_uris=["http://127.0.0.1:*/ui/login"], workdir=workdir) as running:
        yield running
    keep_log(workdir / "oidc-op.log", "oidc-op.log")


def serve_with_provider(provider: RunningProvider, workdir: Path, database_url: str, mapping: Mapping[str, object],
                        name: str, env: Mapping[str, str] | None = None,
                        ) -> contextlib.AbstractContextManager[tuple[str, object]]:
    """``qoss serve`` on ``database_url`` whose console signs in with ``provider`` under ``mapping``
    (its log ``workdir/<name>.log``), with ``env`` besides; its redirect URL is its own address."""
    port = free_port()
    full = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
            "QOSS_STATE_DIR": str(workdir / "state"), "QOSS_EVENT_STREAM_SECONDS": "30",
            "QOSS_OIDC_ISSUER": provider.issuer, "QOSS_OIDC_CLIENT_ID": provider.client_id,
            "QOSS_OIDC_CLIENT_SECRET": provider.client_secret, "QOSS_OIDC_PROVIDER_NAME": "Test IdP",
            "QOSS_OIDC_SCOPES_BY_CLAIM": json.dumps(mapping),
            "QOSS_OIDC_REDIRECT_URL": f"http://127.0.0.1:{port}/ui/oidc/callback",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
            **(env or {})}
    return serving([str(QOSS), "serve", "--database-url", database_url], env=full, log=workdir / f"{name}.log",
                   timeout=90, port=port)  # a loaded machine (the whole suite on two workers) starts it slowly


def oidc_sign_in(page: Page, base: str, user: OidcUser) -> None:
    """From the console's sign-in page through the provider's login form and back."""
    # The example provider has no favicon: its 404 is not the console's trouble.
    page.context.route(re.compile(r"^http://localhost:\d+/favicon\.ico$"), lambda route: route.fulfill(status=204))
    page.on("request", _register_code)
    page.goto(f"{base}/ui")
    page.wait_for_url(re.compile(r".*/ui/login$"))
    page.get_by_role("button", name="Sign in with Test IdP").click()
    page.wait_for_url(re.compile(r"^http://localhost:\d+/login/username"))
    page.get_by_label("Username:").fill(user.username)
    page.get_by_label("Password:").fill(user.password)
    page.get_by_role("button", name="Login").click()


def _register_code(request: Request) -> None:
    """The provider's authorization code, for the secret sweep: never in qoss's log or database."""
    if "/ui/oidc/callback?" in request.url:
        code = parse_qs(urlsplit(request.url).query).get("code")
        if code:
            register(code[0])


def session_cookie(context: BrowserContext) -> str:
    """The console's session cookie in ``context`` (registered for the secret sweep)."""
    found = [c.get("value", "") for c in context.cookies() if c.get("name") == "qoss_session"]
    assert found, context.cookies()
    register(found[0])
    return found[0]
