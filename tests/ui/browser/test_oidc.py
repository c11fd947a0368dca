"""Signing in to the console with an OpenID provider, in headless chromium against a real
``qoss serve`` and a real provider (zitadel/oidc's example OP, built by the suite:
:mod:`tests.fixtures.oidc_provider`), the provider on ``localhost``, another site than the
console's ``127.0.0.1``:

- an admin chooses **Sign in with Test IdP**, logs in on the provider's form and lands in the
  console with the scopes the mapping gives their group (the audit log is theirs to read);
- a user whose group is mapped to ``tunnels:read`` sees the tunnels, and the audit log is
  refused;
- a user whose groups are mapped to nothing is refused, and no session is made;
- signing out ends the session and goes through the provider's ``end_session_endpoint`` back
  to the sign-in page;
- once qoss is restarted with the admins' group no longer mapped (a second ``qoss serve`` on the
  same database), their session is refused.

Sign-in and sign-out are in the audit log under the user's name, without a code or a token.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlalchemy import create_engine, text

from app.bootstrap import prepare_database
from app.settings import Settings
from tests.fixtures.oidc_provider import RunningProvider
from tests.fixtures.secrets import keep_log
from tests.ui.browser.conftest import (
    ALICE,
    BOB,
    CAROL,
    MAPPING,
    NewContext,
    Watched,
    no_trouble,
    serve_with_provider,
    session_cookie,
)
from tests.ui.browser.conftest import oidc_sign_in as _sign_in


class Console:
    """A served console signing in with the provider."""

    def __init__(self, base: str, database_url: str) -> None:
        self.base = base
        self.database_url = database_url

    def rows(self, query: str) -> list[tuple[object, ...]]:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(query))]
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oidc-console")


def _serve(provider: RunningProvider, workdir: Path, database_url: str, mapping: dict[str, object], name: str
           ) -> contextlib.AbstractContextManager[tuple[str, object]]:
    return serve_with_provider(provider, workdir, database_url, mapping, name)


@pytest.fixture(scope="module")
def console(provider: RunningProvider, workdir: Path) -> Iterator[Console]:
    url = f"sqlite:///{workdir / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    try:
        with _serve(provider, workdir, url, MAPPING, "serve") as (base, _):
            yield Console(base, url)
    finally:
        keep_log(workdir / "serve.log", "oidc-console-serve.log")
        keep_log(workdir / "qoss.db", "oidc-console-qoss.db")


def test_an_admin_signs_in_with_the_provider_gets_the_mapped_scopes_and_signs_out(
        console: Console, new_context: NewContext) -> None:
    context = new_context()
    watched = Watched(page := context.new_page())
    _sign_in(page, console.base, ALICE)
    page.wait_for_url(re.compile(r".*/ui/tables$"))
    expect(page.locator("form.who")).to_contain_text("Signed in as oidc:alice@example.test (admin)")
    session_cookie(context)
    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile("Audit"))
    assert console.rows("SELECT user_name, scopes, token_id FROM ui_sessions") == [
        ("oidc:alice@example.test", '["admin"]', None)]

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"^http://127\.0\.0\.1:\d+/ui/login$"))  # back from the provider's sign-out
    assert console.rows("SELECT id_hash FROM ui_sessions") == []
    page.goto(f"{console.base}/ui/tables")
    page.wait_for_url(re.compile(r".*/ui/login$"))
    no_trouble(watched)

    audit = console.rows("SELECT action, object, outcome, token_id, token_name, detail FROM audit_events "
                         "WHERE token_name = 'oidc:alice@example.test' ORDER BY id")
    assert [(a, o, s) for a, o, s, *_ in audit] == [("POST", "/ui/oidc/callback", 200), ("POST", "/ui/logout", 200)]
    assert audit[0][3] is None and "subject u-alice" in str(audit[0][5])  # noqa: PT018
    assert "code=" not in str(console.rows("SELECT object, detail FROM audit_events"))


def test_a_read_only_mapping_sees_the_tunnels_and_not_the_audit_log(
        console: Console, new_context: NewContext) -> None:
    page = new_context().new_page()
    _sign_in(page, console.base, BOB)
    page.wait_for_url(re.compile(r".*/ui/tables$"))
    expect(page.locator("form.who")).to_contain_text("Signed in as oidc:bob@example.test (tunnels:read)")
    expect(page.get_by_role("link", name="Audit")).to_have_count(0)
    with page.expect_response(lambda r: "/ui/events" in r.url) as streamed:  # the tunnel list's live stream
        page.get_by_role("link", name="Tunnels").click()
    assert streamed.value.status == 200
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile("Tunnels"))
    answer = page.goto(f"{console.base}/ui/audit")
    assert answer is not None and answer.status == 403  # noqa: PT018
    expect(page.locator("main")).to_contain_text("audit:read")


def test_a_user_with_no_mapped_group_is_refused_and_no_session_is_made(
        console: Console, new_context: NewContext) -> None:
    before = console.rows("SELECT count(*) FROM ui_sessions")
    page = new_context().new_page()
    _sign_in(page, console.base, CAROL)
    page.wait_for_url(re.compile(r".*/ui/oidc/callback$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Sign-in refused")
    expect(page.locator("main")).to_contain_text("oidc:carol@example.test signed in at the identity provider, but no "
                                                 "qoss scope is mapped to them")
    assert console.rows("SELECT count(*) FROM ui_sessions") == before
    assert not [c for c in page.context.cookies() if c.get("name") == "qoss_session"]


def test_a_session_is_refused_once_its_group_is_no_longer_mapped(
        console: Console, provider: RunningProvider, workdir: Path, new_context: NewContext) -> None:
    context = new_context()
    page = context.new_page()
    _sign_in(page, console.base, ALICE)
    page.wait_for_url(re.compile(r".*/ui/tables$"))
    session_cookie(context)
    narrowed = {"groups": {"netops": ["tunnels:read"]}}
    try:
        with _serve(provider, workdir, console.database_url, narrowed, "serve-narrowed") as (restarted, _):
            page.goto(f"{restarted}/ui/tables")  # the same browser, its cookie (cookies are not kept per port)
            page.wait_for_url(re.compile(r".*/ui/login$"))
            assert len(console.rows("SELECT id_hash FROM ui_sessions WHERE user_name = 'oidc:alice@example.test'")) == 1
            _sign_in(page, restarted, ALICE)  # and signing in again gives nothing now
            expect(page.locator("main")).to_contain_text("no qoss scope is mapped")
    finally:
        keep_log(workdir / "serve-narrowed.log", "oidc-console-serve-narrowed.log")
