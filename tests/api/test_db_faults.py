"""The database going away: 503 with a clear error, no partial write, recovery when it is back."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, create_engine, event, select, text
from sqlalchemy.engine import make_url

from app.main import create_app
from app.settings import Settings
from tests.fixtures.figures import tally

pytestmark = pytest.mark.anyio


def set_connections(database_url: str, allowed: bool) -> None:
    url = make_url(database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
            if not allowed:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": url.database})
    finally:
        admin.dispose()


@pytest.mark.parametrize("db_backend", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
async def test_database_unavailable_is_503_and_nothing_is_half_written(
    client: httpx.AsyncClient, database_url: str
) -> None:
    before = await client.post("/v1/policies", json={"name": "before", "min_levels": {"integrity": 1}})
    assert before.status_code == 201
    set_connections(database_url, False)
    try:
        write = await client.post("/v1/policies", json={"name": "during", "min_levels": {"integrity": 2}})
        read = await client.get("/v1/policies")
        for r in (write, read):
            assert r.status_code == 503, r.text
            assert r.json() == {"error": "DatabaseUnavailable", "detail": "the database is unavailable"}
            assert r.headers["retry-after"] == "1"
    finally:
        set_connections(database_url, True)
    tally("faults injected: PostgreSQL refusing connections (503, no partial write)")
    assert (await client.get("/v1/policies/during")).status_code == 404
    assert (await client.get("/v1/policies/before")).status_code == 200
    after = await client.post("/v1/policies", json={"name": "after", "min_levels": {"integrity": 3}})
    assert after.status_code == 201


def terminate(database_url: str, pid: int) -> None:
    url = make_url(database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        admin.dispose()


WRITES = {
    # (request, the statement after which the connection dies, what must not exist afterwards)
    "rating table": (("POST", "/v1/rating-tables", {"name": "cut", "ratings": [
        {"algorithm": "aes128", "confidentiality": 8, "performance": 8}]}), "INSERT INTO rating_tables",
        "/v1/rating-tables/cut"),
    "policy": (("POST", "/v1/policies", {"name": "cut", "min_levels": {"integrity": 2}}), "INSERT INTO policies",
               "/v1/policies/cut"),
}


@pytest.mark.parametrize("db_backend", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
@pytest.mark.parametrize("write", list(WRITES))
async def test_connection_lost_part_way_through_a_write_is_503_and_writes_nothing(
    settings: Settings, admin_token: str, database_url: str, write: str
) -> None:
    (method, path, body), after, gone = WRITES[write]
    app = create_app(settings)
    killed: list[int] = []

    def cut(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith(after) and not killed:
            killed.append(conn.connection.driver_connection.info.backend_pid)
            terminate(database_url, killed[0])

    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        before = snapshot(database_url)
        event.listen(app.state.runtime.engine, "after_cursor_execute", cut)
        try:
            r = await c.request(method, path, json=body, headers={"X-Request-ID": "cut-1"})
        finally:
            event.remove(app.state.runtime.engine, "after_cursor_execute", cut)
        assert killed, "the write never ran its first insert"
        tally("faults injected: PostgreSQL connection killed part-way through a write (503, nothing written)")
        assert r.status_code == 503, r.text
        assert r.json() == {"error": "DatabaseUnavailable", "detail": "the database is unavailable"}
        assert (await c.get(gone)).status_code == 404
        after_rows = snapshot(database_url)
        audit = ("audit_events", "audit_chain_head", "events")  # the refusal's record (and its event) is written
        assert {k: v for k, v in after_rows.items() if k not in audit} == {
            k: v for k, v in before.items() if k not in audit}
        # The service goes on: the same write succeeds, and the failed one is in the audit log.
        again = await c.request(method, path, json=body)
        assert again.status_code == 201, again.text
        (record,) = [x for x in (await c.get("/v1/audit")).json() if x["client_request_id"] == "cut-1"]
        assert (record["outcome"], record["detail"]) == (503, "DatabaseUnavailable")


def snapshot(database_url: str) -> dict[str, list[str]]:
    engine = create_engine(database_url)
    meta = MetaData()
    try:
        meta.reflect(engine)
        with engine.connect() as conn:
            return {t.name: sorted(repr(tuple(row)) for row in conn.execute(select(t))) for t in meta.sorted_tables}
    finally:
        engine.dispose()
