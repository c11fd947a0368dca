"""Shipped rating tables and policies load into a database once: what an operator deletes
stays deleted across restarts and upgrades, unless they restore it on purpose."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session, sessionmaker

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import downgrade, upgrade
from app.adapters.db.repositories import PolicyRepository, RatingTableRepository
from app.adapters.db.unit_of_work import sql_units_of_work
from app.bootstrap import prepare_database
from app.domain.errors import NotFound
from app.services import policies as policy_svc
from app.services import ratings as rating_svc
from app.settings import Settings

SHIPPED_TABLES = {"esaf-2006", "standards-2026"}
SHIPPED_POLICIES = {"bulk-backup", "high-security", "integrity-only", "mobile-default", "voip", "platform-android",
                    "platform-apple", "platform-networkmanager", "platform-swanctl", "platform-windows"}
#: The schema before shipped data was recorded (what an existing database was migrated to).
BEFORE = "0006"


def _names(factory: sessionmaker[Session]) -> tuple[set[str], set[str]]:
    with factory() as session:
        return ({t["name"] for t in RatingTableRepository(session).list()},
                {p["name"] for p in PolicyRepository(session).list()})


def _delete(factory: sessionmaker[Session], *, table: str | None = None, policy: str | None = None) -> None:
    with sql_units_of_work(factory)() as uow:
        if table:
            rating_svc.delete_table(uow=uow, name=table, default_table="standards-2026")
        if policy:
            policy_svc.delete_policy(uow=uow, name=policy)
        uow.commit()


def test_a_deleted_shipped_table_or_policy_stays_deleted_at_the_next_start(
        database_url: str, session_factory: sessionmaker[Session]) -> None:
    settings = Settings(database_url=database_url)
    first = prepare_database(settings)
    assert (set(first.tables_added), set(first.policies_added)) == (SHIPPED_TABLES, SHIPPED_POLICIES)
    _delete(session_factory, table="esaf-2006", policy="voip")
    again = prepare_database(settings)
    assert (again.tables_added, again.policies_added) == ([], [])
    tables, policies = _names(session_factory)
    assert "esaf-2006" not in tables
    assert "voip" not in policies


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_shipped_table_and_policy_are_restored_on_purpose_through_the_api(
        database_url: str, session_factory: sessionmaker[Session]) -> None:
    import httpx

    from app.main import create_app
    from tests.api.conftest import make_token

    settings = Settings(database_url=database_url, monitor_tunnels=False, reconcile_on_start=False)
    prepare_database(settings)
    _delete(session_factory, table="esaf-2006", policy="voip")
    headers = {"Authorization": f"Bearer {make_token(database_url, 'restorer', ['admin'])}"}
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test", headers=headers) as http:
        restored = await http.post("/v1/rating-tables/esaf-2006/restore")
        assert restored.status_code == 201, restored.text
        assert (restored.json()["revision"], len(restored.json()["ratings"])) == (1, 9)
        with session_factory() as session:
            assert RatingTableRepository(session).get("esaf-2006") == files.load_rating_table(
                Path(Settings().ratings_dir) / "esaf-2006.yaml")
            (first,) = RatingTableRepository(session).revisions("esaf-2006")
            assert first["author"] == "restorer"
        twice = await http.post("/v1/rating-tables/esaf-2006/restore")
        assert (twice.status_code, twice.json()["error"]) == (409, "AlreadyExists")
        unknown = await http.post("/v1/rating-tables/no-such-table/restore")
        assert (unknown.status_code, "no-such-table" in unknown.text) == (404, True)
        policy = await http.post("/v1/policies/voip/restore")
        assert (policy.status_code, policy.json()["revision"]) == (201, 1)
        assert "voip" in _names(session_factory)[1]
        audited = (await http.get("/v1/audit", params={"action": "POST"})).json()
        assert {(r["object"], r["outcome"], r["token_name"]) for r in audited} >= {
            ("/v1/rating-tables/esaf-2006/restore", 201, "restorer"), ("/v1/policies/voip/restore", 201, "restorer")}
    # Restored on purpose, still loaded once: a later start neither duplicates nor re-adds it.
    again = prepare_database(Settings(database_url=database_url))
    assert (again.tables_added, again.policies_added) == ([], [])


def _insert_as_before(conn: Connection, rows: str, revisions: str, owner: str, document: dict[str, object],
                      message: str, *, changes: bool = False) -> None:
    """A document at revision 1, written with plain SQL: the repositories speak today's schema."""
    now = datetime.now(UTC)
    insert = f"INSERT INTO {rows} (name, current_revision, created_at, updated_at) VALUES (:n, 1, :t, :t) RETURNING id"  # noqa: S608 - our own names
    row_id = conn.execute(text(insert), {"n": document["name"], "t": now}).scalar_one()
    columns = f"{owner}, revision, author, message, created_at, content" + (", changes" if changes else "")
    values = ":o, 1, 'shipped', :m, :t, :c" + (", '[]'" if changes else "")
    conn.execute(text(f"INSERT INTO {revisions} ({columns}) VALUES ({values})"),  # noqa: S608 - our own names
                 {"o": row_id, "m": message, "t": now, "c": json.dumps(document)})


def test_a_database_from_before_the_record_keeps_its_deletions_after_upgrading(database_url: str) -> None:
    """Migrated and loaded by the previous release, an operator deleted a shipped table and
    a policy; the upgrade's data step must count them as loaded."""
    downgrade(database_url, BEFORE)
    engine = make_engine(database_url)
    try:
        factory = make_session_factory(engine)
        settings = Settings(database_url=database_url)
        with engine.begin() as conn:  # what the previous release's start-up did, in that release's schema
            for table in files.load_rating_tables(settings.ratings_dir):
                _insert_as_before(conn, "rating_tables", "rating_table_revisions", "table_id", table.as_dict(),
                                  "loaded from ratings/", changes=True)
            for policy in files.load_policies(settings.policies_dir):
                _insert_as_before(conn, "policies", "policy_revisions", "policy_id", policy.as_dict(), "created")
        with engine.begin() as conn:  # the operator's deletions, in that release's schema
            for rows, revisions, owner, name in (("rating_tables", "rating_table_revisions", "table_id", "esaf-2006"),
                                                 ("policies", "policy_revisions", "policy_id", "voip")):
                row_id = conn.execute(text(f"SELECT id FROM {rows} WHERE name = :n"),  # noqa: S608 - our own names
                                      {"n": name}).scalar_one()
                conn.execute(text(f"DELETE FROM {revisions} WHERE {owner} = :i"), {"i": row_id})  # noqa: S608
                conn.execute(text(f"DELETE FROM {rows} WHERE id = :i"), {"i": row_id})  # noqa: S608
        upgrade(database_url)
        prepared = prepare_database(settings)
        assert (prepared.tables_added, prepared.policies_added) == ([], [])
        tables, policies = _names(factory)
        assert tables == SHIPPED_TABLES - {"esaf-2006"}
        assert policies == SHIPPED_POLICIES - {"voip"}
    finally:
        engine.dispose()


def test_a_database_from_before_the_record_that_was_never_started_gets_everything(database_url: str) -> None:
    downgrade(database_url, BEFORE)
    upgrade(database_url)
    prepared = prepare_database(Settings(database_url=database_url))
    assert (set(prepared.tables_added), set(prepared.policies_added)) == (SHIPPED_TABLES, SHIPPED_POLICIES)


def test_a_new_shipped_table_of_a_later_release_still_loads(database_url: str, tmp_path: Path) -> None:
    """Names already offered are never offered again; a name never offered is."""
    settings = Settings(database_url=database_url)
    prepare_database(settings)
    extra = tmp_path / "ratings"
    extra.mkdir()
    for table in files.load_rating_tables(settings.ratings_dir):
        (extra / f"{table.name}.yaml").write_text(files.dump_rating_table_yaml(table))
    text = files.dump_rating_table_yaml(files.load_rating_table(extra / "esaf-2006.yaml")).replace(
        "name: esaf-2006", "name: esaf-2007")
    (extra / "esaf-2007.yaml").write_text(text)
    prepared = prepare_database(settings.model_copy(update={"ratings_dir": extra}))
    assert prepared.tables_added == ["esaf-2007"]


def test_restoring_needs_a_shipped_name(session_factory: sessionmaker[Session], database_url: str) -> None:
    prepare_database(Settings(database_url=database_url))
    with sql_units_of_work(session_factory)() as uow, pytest.raises(NotFound, match="no-such"):
        rating_svc.restore_shipped_table(uow=uow, tables=[], name="no-such")
