"""A real ``qoss serve`` (uvicorn, SQLite): what the audit log holds after a crash or a clean
stop, and which address it records as a request's source."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import AuditRow, RatingTableRow
from app.adapters.db.refusals import more_refusals
from app.bootstrap import prepare_database
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.served import serving

QOSS = Path(sys.executable).parent / "qoss"
WORKERS = 6
EDITS_PER_WORKER = 200  # a bound on the load whatever happens
KILL_AFTER = 60  # answered edits before the SIGKILL


@contextmanager
def served(tmp_path: Path, database_url: str, **env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``qoss serve`` on a free loopback port; stopped (SIGTERM, then SIGKILL) on the way out."""
    with serving([str(QOSS), "serve", "--database-url", database_url],
                 env={**os.environ, "QOSS_MONITOR_TUNNELS": "false", **env},
                 log=tmp_path / f"serve-{len(list(tmp_path.glob('serve-*.log')))}.log") as running:
        yield running


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, str]:
    """A prepared SQLite database and an admin token on it."""
    url = f"sqlite:///{tmp_path / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    return url, make_token(url, "crash-admin", ["admin"])


def audit_rows(url: str) -> dict[str, AuditRow]:
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            return {row.request_id: row for row in session.scalars(select(AuditRow))}
    finally:
        engine.dispose()


def test_every_change_answered_2xx_has_its_audit_record_after_kill_9(
        tmp_path: Path, database: tuple[str, str]) -> None:
    url, token = database
    answered: list[tuple[str, int, str, int]] = []  # request id, status, table, revision answered
    lock = threading.Lock()
    stop = threading.Event()
    headers = {"Authorization": f"Bearer {token}"}

    def edit(base: str, table: str) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=10) as c:
            try:
                r = c.post("/v1/rating-tables", json={"name": table, "ratings": [
                    {"algorithm": "aes128", "confidentiality": 8, "performance": 8}]})
            except httpx.TransportError:
                return  # the server is gone
            if r.status_code != 201:
                return
            with lock:
                answered.append((r.headers["x-request-id"], 201, table, 1))
            revision = 1
            for i in range(EDITS_PER_WORKER):
                if stop.is_set():
                    return
                try:
                    r = c.patch(f"/v1/rating-tables/{table}/ratings/aes128", json={"confidentiality": i % 11},
                                headers={"If-Match": f'"{revision}"'})
                except httpx.TransportError:
                    return  # the server is gone
                if r.status_code == 200:
                    revision = r.json()["revision"]
                    with lock:
                        answered.append((r.headers["x-request-id"], 200, table, revision))

    with served(tmp_path, url) as (base, proc):
        threads = [threading.Thread(target=edit, args=(base, f"crash-{n}")) for n in range(WORKERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(answered) < KILL_AFTER and time.monotonic() < deadline and any(t.is_alive() for t in threads):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert len(answered) >= KILL_AFTER, "the load did not get going"

    records = audit_rows(url)
    missing = [(rid, status) for rid, status, *_ in answered if rid not in records]
    assert not missing, f"{len(missing)} of {len(answered)} answered changes have no audit record"
    for rid, status, _, _ in answered:
        assert (records[rid].outcome, records[rid].token_name) == (status, "crash-admin")
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            current = {r.name: r.current_revision for r in session.scalars(select(RatingTableRow))}
    finally:
        engine.dispose()
    for _, _, table, revision in answered:  # and every change answered is there
        assert current[table] >= revision


def test_refusals_are_all_counted_on_a_clean_stop(tmp_path: Path, database: tuple[str, str]) -> None:
    url, _ = database
    with served(tmp_path, url) as (base, proc), httpx.Client(base_url=base, timeout=10) as c:
        ids = []
        for n in range(30):
            r = c.post("/v1/policies", json={"name": f"refused-{n}"})
            assert r.status_code == 401
            ids.append(r.headers["x-request-id"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once stopped
    records = audit_rows(url)
    # The first refusal has its own entry; the 29 like it, refused within the same window, are
    # written as one entry that counts them when the service stops.
    assert records[ids[0]].outcome == 401
    summaries = [r for r in records.values() if more_refusals(r.detail)]
    assert [(r.outcome, more_refusals(r.detail)) for r in summaries] == [(401, 29)]
    assert ids[0] in summaries[0].detail


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(tmp_path: Path, database: tuple[str, str]) -> None:
    url, _ = database
    with served(tmp_path, url) as (base, _proc):
        sent = []
        for headers in ({"X-Forwarded-For": "6.6.6.6"}, {"Forwarded": "for=6.6.6.7"}):
            r = httpx.post(f"{base}/v1/policies", json={"name": "x"}, headers=headers, timeout=10)
            assert r.status_code == 401
            sent.append(r.headers["x-request-id"])
    records = audit_rows(url)
    assert [records[rid].source for rid in sent] == ["127.0.0.1", "127.0.0.1"]


def test_forwarded_headers_from_a_trusted_proxy_name_the_client(tmp_path: Path, database: tuple[str, str]) -> None:
    url, _ = database
    sent = []
    with served(tmp_path, url, QOSS_TRUSTED_PROXIES="127.0.0.1") as (base, _proc):
        for headers in ({"X-Forwarded-For": "6.6.6.6"}, {"X-Forwarded-For": "203.0.113.9, 127.0.0.1"},
                        {"X-Forwarded-For": "1.1.1.1, 203.0.113.10"},  # the client's own entry comes first
                        {"Forwarded": "for=6.6.6.7"},  # not the header this proxy writes
                        {"X-Forwarded-For": "not-an-address"}):
            r = httpx.post(f"{base}/v1/policies", json={"name": "x"}, headers=headers, timeout=10)
            assert r.status_code == 401
            sent.append(r.headers["x-request-id"])
    with served(tmp_path, url, QOSS_TRUSTED_PROXIES="127.0.0.0/8",
                QOSS_FORWARDED_HEADER="forwarded") as (base, _proc):
        for headers in ({"Forwarded": 'for="[2001:db8::7]:4711";proto=https'},
                        {"Forwarded": "for=192.0.2.1, for=198.51.100.2;by=127.0.0.1"},
                        {"X-Forwarded-For": "6.6.6.6"}):
            r = httpx.post(f"{base}/v1/policies", json={"name": "x"}, headers=headers, timeout=10)
            assert r.status_code == 401
            sent.append(r.headers["x-request-id"])
    records = audit_rows(url)
    assert [records[rid].source for rid in sent] == [
        "6.6.6.6", "203.0.113.9", "203.0.113.10", "127.0.0.1", "127.0.0.1",
        "2001:db8::7", "198.51.100.2", "127.0.0.1"]
