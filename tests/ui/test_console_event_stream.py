"""The console's own event stream (``/ui/events``) over a real ``qoss serve``: it ends within
a second of the session's sign-out or its token's revocation, and it carries only what the
signed-in token's scopes may read (the audit entries only to a token with ``audit:read``)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app.bootstrap import prepare_database
from app.settings import Settings
from tests.api.conftest import make_token
from tests.api.test_events import Follower, served
from tests.fixtures.secrets import register
from tests.ui.conftest import csrf_of

TABLE = "/v1/rating-tables/esaf-2006"


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, str]:
    """A prepared SQLite database and an admin token on it."""
    url = f"sqlite:///{tmp_path / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    return url, make_token(url, "console-admin", ["admin"])


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger ``name`` says nothing below INFO meanwhile."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def signed_in(base: str, token: str) -> Iterator[tuple[httpx.Client, str]]:
    """A browser signed in to the console with ``token``: its client and the session's CSRF token."""
    with httpx.Client(base_url=base, timeout=10) as browser:
        form = browser.get("/ui/login")
        with _quiet("httpcore"):  # its debug log shows response headers: the session's Set-Cookie
            answer = browser.post("/ui/login", data={"csrf": csrf_of(form.text), "token": token})
        assert answer.status_code == 303, answer.text
        register(browser.cookies["qoss_session"])  # the secret sweep: never in a database or a log
        page = browser.get("/ui/tables")
        assert page.status_code == 200
        yield browser, csrf_of(page.text)


@contextmanager
def following(base: str, browser: httpx.Client) -> Iterator[Follower]:
    """The console's event stream, followed with ``browser``'s session cookie."""
    follower = Follower(base, None, path="/ui/events", cookies={"qoss_session": browser.cookies["qoss_session"]})
    try:
        assert follower.started() == 200
        yield follower
    finally:
        follower.close()


def test_signing_out_ends_the_consoles_event_stream_within_a_second(
        tmp_path: Path, database: tuple[str, str]) -> None:
    url, _ = database
    reader = make_token(url, "console-reader", ["tunnels:read"])
    with served(tmp_path, url) as base, signed_in(base, reader) as (browser, csrf), \
            following(base, browser) as follower:
        assert browser.post("/ui/logout", data={"csrf": csrf}).status_code == 303
        assert follower.ended.wait(3), "the stream of a signed-out session went on"
        assert ": stream ended: the console session has ended" in follower.comments


def test_revoking_the_token_ends_the_consoles_event_stream_within_a_second(
        tmp_path: Path, database: tuple[str, str]) -> None:
    url, admin = database
    reader = make_token(url, "console-reader", ["tunnels:read"])
    with served(tmp_path, url) as base, signed_in(base, reader) as (browser, _), \
            following(base, browser) as follower:
        revoked = httpx.delete(f"{base}/v1/tokens/{reader.split('_')[1]}",
                               headers={"Authorization": f"Bearer {admin}"}, timeout=10)
        assert revoked.status_code == 204
        assert follower.ended.wait(3), "the stream of a revoked token's session went on"
        assert ": stream ended: the token was revoked" in follower.comments


def test_the_consoles_stream_carries_audit_entries_only_to_a_token_that_may_read_the_audit(
        tmp_path: Path, database: tuple[str, str]) -> None:
    url, admin = database
    low = make_token(url, "console-low", ["tunnels:read", "ratings:write"])
    auditor = make_token(url, "console-auditor", ["audit:read"])
    with served(tmp_path, url) as base, signed_in(base, low) as (low_browser, _), \
            signed_in(base, auditor) as (audit_browser, _), following(base, low_browser) as limited, \
            following(base, audit_browser) as everything:
        revision = httpx.get(f"{base}{TABLE}", timeout=10).headers["ETag"]
        edit = httpx.patch(f"{base}{TABLE}/ratings/3des", json={"performance": 0.5}, timeout=10,
                           headers={"Authorization": f"Bearer {admin}", "If-Match": revision})
        assert edit.status_code == 200, edit.text
        seen = everything.take(2)
        assert [e["kind"] for e in seen] == ["rating_table.revision", "audit"]
        assert seen[1]["data"]["object"] == f"{TABLE}/ratings/3des"
        assert [e["kind"] for e in limited.take(1)] == ["rating_table.revision"]
        with pytest.raises(queue.Empty):
            limited.take(1, timeout=1.5)
