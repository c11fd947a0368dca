"""While strongSwan brings a tunnel up, no database transaction of the request stays open; an
edit committed in that window is judged when the tunnel is recorded: one that changes what
strongSwan was given is a 409 with nothing left loaded, any other leaves the tunnel recorded
under the edit's revision."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.services import ratings
from app.settings import Settings
from tests.api.test_idempotency import served, tunnel
from tests.fakes.fake_charon import FakeCharon, Reply
from tests.unit.services.test_tunnels_service import established

pytestmark = pytest.mark.anyio

PSK = "first-pre-shared-key-of-32-chars-or-more-A"  # registered by served()


def _on_initiate(fake: FakeCharon, during: Any) -> list[Any]:
    """Have ``initiate`` run ``during()`` (its result kept) and then bring the conn up."""
    seen: list[Any] = []

    def up(message: dict[str, object]) -> Reply:
        seen.append(during())
        established(fake, str(message["ike"]))
        return Reply({"success": "yes"})

    fake.script("initiate", up)
    return seen


def _edit(settings: Settings, algorithm: str, changes: dict[str, Any]) -> int:
    """A rating edit of standards-2026 committed by another writer (as another replica would)."""
    engine = make_engine(settings.database_url)
    try:
        with SqlUnitOfWork(make_session_factory(engine)(), owned=True) as uow:
            current = uow.tables.current_revision("standards-2026")
            table = ratings.update_rating(uow=uow, name="standards-2026", algorithm=algorithm, changes=changes,
                                          expected_revision=current, author="other-replica")
            uow.commit()
            return table.revision
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_backend", ["sqlite"])
async def test_sqlites_write_lock_is_free_while_strongswan_brings_the_tunnel_up(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    path = settings.database_url.removeprefix("sqlite:///")

    def write_now() -> str:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")  # "database is locked" at once if the request held it
            conn.execute("ROLLBACK")
            return "free"
        except sqlite3.OperationalError as exc:
            return str(exc)
        finally:
            conn.close()

    async with served(settings, admin_token, tmp_path) as (c, fake):
        seen = _on_initiate(fake, write_now)
        r = await c.post("/v1/tunnels", json=tunnel(PSK))
        assert r.status_code == 201, r.text
        assert seen == ["free"]
        # Taking it down likewise: the lock is free while charon terminates and unloads.
        unloading: list[str] = []

        def unload(message: dict[str, object]) -> Reply:
            unloading.append(write_now())
            fake.conns.pop(str(message["name"]), None)
            return Reply({"success": "yes"})

        fake.script("unload-conn", unload)
        assert (await c.delete(f"/v1/tunnels/{r.json()['id']}")).status_code == 204
        assert unloading == ["free"]  # the initiator's (the far end is an unmanaged peer)
        assert (await c.get(f"/v1/tunnels/{r.json()['id']}")).status_code == 404


async def test_an_edit_in_the_window_that_changes_the_choice_is_a_409_and_nothing_stays(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    # table_cache_ttl 0: the retry sees the other writer's edit at once (SQLite's default trusts a read for 1 s)
    async with served(settings, admin_token, tmp_path, table_cache_ttl=0) as (c, fake):
        _on_initiate(fake, lambda: None)
        first = await c.post("/v1/tunnels", json=tunnel(PSK))
        assert first.status_code == 201, first.text
        suite = first.json()["suite"]
        assert (await c.delete(f"/v1/tunnels/{first.json()['id']}")).status_code == 204
        # The suite's integrity drops below the request's minimum of 5 while the next one comes up.
        weakened = suite["encryption"] if suite.get("aead") else suite["integrity"]
        _on_initiate(fake, lambda: _edit(settings, weakened, {"integrity": 1}))
        r = await c.post("/v1/tunnels", json=tunnel(PSK))
        assert r.status_code == 409, r.text
        assert "changed while it was being set up" in r.json()["detail"]
        assert fake.conns == {}
        assert fake.shared == {}
        assert (await c.get("/v1/tunnels")).json() == []
        _on_initiate(fake, lambda: None)
        again = await c.post("/v1/tunnels", json=tunnel(PSK))  # the retry is negotiated under the edit
        assert again.status_code == 201, again.text
        assert weakened not in (again.json()["suite"]["encryption"],
                                again.json()["suite"]["integrity"])


async def test_an_edit_in_the_window_that_changes_nothing_of_it_is_recorded_as_its_provenance(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    async with served(settings, admin_token, tmp_path) as (c, fake):
        revisions = _on_initiate(fake, lambda: _edit(settings, "camellia256ctr", {"confidentiality": 2}))
        r = await c.post("/v1/tunnels", json=tunnel(PSK))
        assert r.status_code == 201, r.text
        record = (await c.get(f"/v1/tunnels/{r.json()['id']}")).json()
        assert record["provenance"]["tables"] == {"standards-2026": revisions[0]}
        assert len(fake.conns) == 1
