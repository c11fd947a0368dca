"""The live event stream of a real ``qoss serve`` (GET /v1/events, Server-Sent Events): every
change has its event, a token sees what its scopes allow, a reconnect with Last-Event-ID
misses nothing, and ``qoss events`` follows it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.bootstrap import prepare_database
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.served import serving

TABLE = "/v1/rating-tables/esaf-2006"


@contextmanager
def served(tmp_path: Path, url: str, **env: str) -> Iterator[str]:
    with serving([sys.executable, "-m", "app.cli", "serve", "--database-url", url], cwd=REPO_ROOT,
                 env={**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false", **env},
                 log=tmp_path / f"serve-{len(list(tmp_path.glob('serve-*.log')))}.log") as (base, _):
        yield base


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, str, str]:
    """A prepared SQLite database, an admin token and a tunnels:read token on it."""
    url = f"sqlite:///{tmp_path / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    return url, make_token(url, "events-admin", ["admin"]), make_token(url, "events-reader", ["tunnels:read"])


class Follower:
    """Reads an event stream in a thread; ``take`` waits (bounded) for the next events, ``ended``
    is set once the server has closed the stream, ``comments`` holds its comment lines."""

    def __init__(self, base: str, token: str | None, last_event_id: int | None = None, *,
                 path: str = "/v1/events", cookies: dict[str, str] | None = None) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.status: queue.Queue[int] = queue.Queue()
        self.comments: list[str] = []
        self.ended = threading.Event()
        self._stop = threading.Event()
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self._thread = threading.Thread(target=self._read, args=(f"{base}{path}", headers, cookies or {}),
                                        daemon=True)
        self._thread.start()

    def _read(self, url: str, headers: dict[str, str], cookies: dict[str, str]) -> None:
        try:
            with httpx.Client(cookies=cookies, timeout=httpx.Timeout(5, read=30)) as client, \
                    client.stream("GET", url, headers=headers) as r:
                self.status.put(r.status_code)
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("data: "):
                        self.events.put(json.loads(line[6:]))
                    elif line.startswith(":"):
                        self.comments.append(line)
                self.ended.set()
        except httpx.HTTPError:
            if not self._stop.is_set():  # the server went away while followed: the test sees no more events
                self.status.put(0)

    def started(self) -> int:
        return self.status.get(timeout=10)

    def take(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return [self.events.get(timeout=timeout) for _ in range(n)]

    def close(self) -> None:
        self._stop.set()


def _edit(c: httpx.Client, admin: str, performance: float) -> int:
    revision = c.get(TABLE).headers["ETag"]
    r = c.patch(f"{TABLE}/ratings/3des", json={"performance": performance},
                headers={"Authorization": f"Bearer {admin}", "If-Match": revision})
    assert r.status_code == 200, r.text
    return int(r.json()["revision"])


def test_changes_stream_to_followers_by_scope_and_a_reconnect_misses_nothing(
        tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, admin, reader = database
    with served(tmp_path, url) as base, httpx.Client(base_url=base, timeout=10) as c:
        everything, limited = Follower(base, admin), Follower(base, reader)
        try:
            assert (everything.started(), limited.started()) == (200, 200)
            revision = _edit(c, admin, 0.5)
            seen = everything.take(2)  # the revision and the edit's audit entry, in that order
            assert [(e["kind"], e["subject"]) for e in seen] == [("rating_table.revision", "esaf-2006"),
                                                                  ("audit", seen[1]["subject"])]
            assert seen[0]["data"] == {"revision": revision, "author": "events-admin"}
            assert seen[1]["data"]["object"] == f"{TABLE}/ratings/3des"
            assert seen[0]["id"] < seen[1]["id"]
            (only,) = limited.take(1)  # no audit:read: the audit entry is not shown
            assert only["kind"] == "rating_table.revision"
            with pytest.raises(queue.Empty):
                limited.take(1, timeout=1.5)
        finally:
            everything.close()
            limited.close()
        last = seen[-1]["id"]
        later = [_edit(c, admin, 0.4), _edit(c, admin, 0.3)]  # while nobody follows
        resumed = Follower(base, admin, last_event_id=last)
        try:
            assert resumed.started() == 200
            got = resumed.take(4)
            assert [e["kind"] for e in got] == ["rating_table.revision", "audit"] * 2
            assert [e["data"]["revision"] for e in got[::2]] == later
            assert all(e["id"] > last for e in got)
        finally:
            resumed.close()
        follow = subprocess.run([sys.executable, "-m", "app.cli", "events", "--url", base, "--after", str(last),
                                 "--count", "2"], cwd=REPO_ROOT, env={**os.environ, "QOSS_TOKEN": admin},
                                capture_output=True, text=True, timeout=60, check=False)
        assert follow.returncode == 0, follow.stderr
        lines = [json.loads(line) for line in follow.stdout.splitlines()]
        assert [e["id"] for e in lines] == [e["id"] for e in got[:2]]


def test_a_stream_needs_a_token_and_their_number_is_bounded(tmp_path: Path, database: tuple[str, str, str]
                                                            ) -> None:
    url, admin, _ = database
    with served(tmp_path, url, QOSS_MAX_EVENT_STREAMS="1") as base:
        assert httpx.get(f"{base}/v1/events", timeout=5).status_code == 401
        too_far = httpx.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {admin}",
                                                          "Last-Event-ID": "999999999999"}, timeout=5)
        assert too_far.status_code == 422, too_far.text
        first = Follower(base, admin)
        try:
            assert first.started() == 200
            r = httpx.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {admin}"}, timeout=5)
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "1"
            assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        finally:
            first.close()


def test_a_stream_ends_after_its_time_and_the_client_resumes(tmp_path: Path, database: tuple[str, str, str]
                                                             ) -> None:
    url, admin, _ = database
    with served(tmp_path, url, QOSS_EVENT_STREAM_SECONDS="1") as base, httpx.Client(base_url=base, timeout=10) as c:
        with c.stream("GET", "/v1/events", headers={"Authorization": f"Bearer {admin}"},
                      params={"after": 0}) as r:
            ids = [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")]  # returns: the stream ended
        assert ids == sorted(ids)
        assert ids  # the token creation's audit entry at least
        revision = _edit(c, admin, 0.2)
        with c.stream("GET", "/v1/events", headers={"Authorization": f"Bearer {admin}",
                                                    "Last-Event-ID": str(ids[-1])}) as r:
            rest = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [e["kind"] for e in rest] == ["rating_table.revision", "audit"]
        assert rest[0]["data"]["revision"] == revision



def test_a_stopping_server_ends_its_event_streams_instead_of_waiting_for_them(
        tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, admin, _ = database
    with serving([sys.executable, "-m", "app.cli", "serve", "--database-url", url], cwd=REPO_ROOT,
                 env={**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false"},
                 log=tmp_path / "serve-stop.log") as (base, proc):
        follower = Follower(base, admin)
        try:
            assert follower.started() == 200
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)  # not held open by the stream (it would be for an hour)
        finally:
            follower.close()
        # a graceful stop (uvicorn raises the signal again once done: the exit status is SIGTERM's)
        assert "Application shutdown complete" in (tmp_path / "serve-stop.log").read_text()
        follower._thread.join(5)
        assert not follower._thread.is_alive()  # the stream ended; its client may resume elsewhere


def _token_id(token: str) -> str:
    return token.split("_")[1]


def _ends_within(follower: Follower, seconds: float) -> bool:
    return follower.ended.wait(seconds)


def test_a_revoked_tokens_streams_end_within_a_second_and_free_their_places(
        tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, admin, reader = database
    with served(tmp_path, url, QOSS_MAX_EVENT_STREAMS="2") as base, httpx.Client(base_url=base, timeout=10) as c:
        followers = [Follower(base, reader), Follower(base, reader)]
        try:
            assert [f.started() for f in followers] == [200, 200]
            full = c.get("/v1/events", headers={"Authorization": f"Bearer {admin}"})
            assert full.status_code == 503, full.text  # the reader's streams hold every place
            assert c.delete(f"/v1/tokens/{_token_id(reader)}",
                            headers={"Authorization": f"Bearer {admin}"}).status_code == 204
            assert all(_ends_within(f, 3) for f in followers), "a revoked token's stream went on"
            assert all(": stream ended: the token was revoked" in f.comments for f in followers)
            admitted = Follower(base, admin)  # the places are free again
            try:
                assert admitted.started() == 200
            finally:
                admitted.close()
        finally:
            for f in followers:
                f.close()


def test_an_expired_tokens_stream_ends(tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, _, _ = database
    with served(tmp_path, url) as base:
        brief = make_token(url, "events-brief", ["audit:read"], expires_in=2)
        follower = Follower(base, brief)
        try:
            assert follower.started() == 200
            assert _ends_within(follower, 5), "an expired token's stream went on"
            assert ": stream ended: the token has expired" in follower.comments
            refused = httpx.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {brief}"}, timeout=5)
            assert refused.status_code == 401
        finally:
            follower.close()


def test_a_token_follows_at_most_its_cap_of_streams_while_others_still_get_theirs(
        tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, admin, reader = database
    with served(tmp_path, url, QOSS_MAX_EVENT_STREAMS_PER_TOKEN="5") as base:
        followers = [Follower(base, reader) for _ in range(5)]
        try:
            assert [f.started() for f in followers] == [200] * 5
            sixth = httpx.get(f"{base}/v1/events", headers={"Authorization": f"Bearer {reader}"}, timeout=5)
            assert sixth.status_code == 429, sixth.text
            assert sixth.json()["error"] == "TooManyStreams"
            assert "max_event_streams_per_token" in sixth.json()["detail"]
            assert "5" in sixth.json()["detail"]
            assert sixth.headers["Retry-After"]
            other = Follower(base, admin)  # another token still gets its streams
            followers.append(other)
            assert other.started() == 200
        finally:
            for f in followers:
                f.close()


def test_a_low_privilege_tokens_stream_carries_no_audit_frames(
        tmp_path: Path, database: tuple[str, str, str]) -> None:
    url, _, _ = database
    editor = make_token(url, "events-editor", ["ratings:write", "tunnels:read"])
    auditor = make_token(url, "events-auditor", ["audit:read"])
    with served(tmp_path, url) as base, httpx.Client(base_url=base, timeout=10) as c:
        low, audit = Follower(base, editor), Follower(base, auditor)
        try:
            assert (low.started(), audit.started()) == (200, 200)
            _edit(c, editor, 0.5)  # the editor's own change: its revision and its audit entry
            assert [e["kind"] for e in audit.take(2)] == ["rating_table.revision", "audit"]
            assert [e["kind"] for e in low.take(1)] == ["rating_table.revision"]
            with pytest.raises(queue.Empty):
                low.take(1, timeout=1.5)
        finally:
            low.close()
            audit.close()
