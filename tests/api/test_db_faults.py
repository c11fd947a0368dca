"""The database going away: 503 with a clear error, no partial write, recovery when it is back."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

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
    finally:
        set_connections(database_url, True)
    assert (await client.get("/v1/policies/during")).status_code == 404
    assert (await client.get("/v1/policies/before")).status_code == 200
    after = await client.post("/v1/policies", json={"name": "after", "min_levels": {"integrity": 3}})
    assert after.status_code == 201
