"""Idempotency-Key: a retry gets the first answer only when it asks for exactly the same thing,
secrets included (judged by a keyed hash, never by the secret or a plain hash of it)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import ApiTokenRow, IdempotencyRow
from app.adapters.db.unit_of_work import SqlUnitOfWork, sql_units_of_work
from app.main import create_app
from app.services import idempotency as idem
from app.settings import Settings
from app.web.schemas import TunnelIn
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.secrets import register
from tests.unit.services.test_tunnels_service import up_on_initiate

pytestmark = pytest.mark.anyio

PSK_A = "first-pre-shared-key-of-32-chars-or-more-A"
PSK_B = "second-pre-shared-key-of-32-chars-or-more-B"


def tunnel(psk: str) -> dict[str, object]:
    return {"initiator": "left", "remote_ts": ["10.2.0.0/24"], "min_levels": {"integrity": 5},
            "peer": {"address": "10.99.0.2", "identity": "peer.example", "psk": psk}}


@asynccontextmanager
async def served(settings: Settings, admin_token: str, tmp_path: Path,
                 **changes: Any) -> AsyncIterator[tuple[httpx.AsyncClient, FakeCharon]]:
    """An admin client with one gateway, ``left``, on a fake charon that brings every conn up."""
    for psk in (PSK_A, PSK_B):
        register(psk)
    with FakeCharon(tmp_path / "left.vici") as fake:
        up_on_initiate(fake)
        app = create_app(settings.model_copy(update={"vici_socket_dirs": [tmp_path], "monitor_tunnels": False,
                                                     **changes}))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
            headers={"Authorization": f"Bearer {admin_token}"},
        ) as c:
            r = await c.post("/v1/gateways", json={"name": "left", "vici_socket": str(fake.socket_path),
                                                   "ike_address": "10.99.0.1", "inside_networks": ["10.1.0.0/24"]})
            assert r.status_code == 201, r.text
            yield c, fake


@pytest.fixture
async def tunnel_client(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with served(settings, admin_token, tmp_path) as (c, _):
        yield c


def _claim_as_if_its_process_died(settings: Settings, key: str, *, seconds_ago: float) -> None:
    """Make ``key``'s row what a request killed part-way leaves: claimed ``seconds_ago``, unanswered."""
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            session.execute(update(IdempotencyRow).where(IdempotencyRow.key == key).values(
                status=0, body={}, created_at=datetime.now(UTC) - timedelta(seconds=seconds_ago)))
            session.commit()
    finally:
        engine.dispose()


async def test_a_claim_left_by_a_killed_request_is_taken_over_after_the_lease_without_a_second_tunnel(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    async with served(settings, admin_token, tmp_path, idempotency_lease=30) as (c, fake):
        headers = {"Idempotency-Key": "killed-after-commit"}
        first = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert first.status_code == 201, first.text
        loads = fake.count("load-conn")
        # Its record committed, then its process died before the answer was stored.
        _claim_as_if_its_process_died(settings, "killed-after-commit", seconds_ago=5)
        early = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert early.status_code == 409, early.text  # within the lease: it may still be running
        _claim_as_if_its_process_died(settings, "killed-after-commit", seconds_ago=31)
        retried = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert (retried.status_code, retried.headers.get("idempotent-replayed")) == (201, "true"), retried.text
        assert retried.json()["id"] == first.json()["id"]
        assert fake.count("load-conn") == loads  # answered from the record: nothing loaded again
        again = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert again.json()["id"] == first.json()["id"]  # and remembered
        assert len((await c.get("/v1/tunnels")).json()) == 1


async def test_a_claim_left_before_any_record_is_run_again_after_the_lease(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    async with served(settings, admin_token, tmp_path, idempotency_lease=30) as (c, fake):
        headers = {"Idempotency-Key": "killed-before-commit"}
        engine = make_engine(settings.database_url)
        try:
            with make_session_factory(engine)() as session:  # claimed by a request killed before its record
                uow = SqlUnitOfWork(session)
                body = TunnelIn.model_validate(tunnel(PSK_A)).to_domain()
                assert uow.idempotency.reserve(next(iter(_token_ids(session))), "killed-before-commit",
                                               idem.fingerprint(body, key=idem.server_key(uow)))
                session.commit()
        finally:
            engine.dispose()
        _claim_as_if_its_process_died(settings, "killed-before-commit", seconds_ago=31)
        retried = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert retried.status_code == 201, retried.text
        assert "idempotent-replayed" not in retried.headers
        assert fake.count("load-conn") == 1
        again = await c.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
        assert (again.json()["id"], again.headers.get("idempotent-replayed")) == (retried.json()["id"], "true")
        assert len((await c.get("/v1/tunnels")).json()) == 1


def _token_ids(session: Session) -> list[str]:
    return list(session.scalars(select(ApiTokenRow.id)))


async def test_the_same_key_with_another_psk_is_a_key_reuse_not_the_first_answer(
        tunnel_client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "peer-tunnel-1"}
    first = await tunnel_client.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
    assert first.status_code == 201, first.text
    again = await tunnel_client.post("/v1/tunnels", json=tunnel(PSK_A), headers=headers)
    assert (again.status_code, again.headers.get("idempotent-replayed")) == (201, "true")
    assert again.json()["id"] == first.json()["id"]
    other = await tunnel_client.post("/v1/tunnels", json=tunnel(PSK_B), headers=headers)
    assert other.status_code == 422, other.text
    assert other.json()["error"] == "InvalidInput"
    assert "idempotent-replayed" not in other.headers
    assert len((await tunnel_client.get("/v1/tunnels")).json()) == 1


async def test_the_stored_fingerprint_is_neither_the_psk_nor_a_plain_hash_of_it(
        tunnel_client: httpx.AsyncClient, settings: Settings) -> None:
    r = await tunnel_client.post("/v1/tunnels", json=tunnel(PSK_A), headers={"Idempotency-Key": "peer-tunnel-2"})
    assert r.status_code == 201, r.text
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            (row,) = session.scalars(select(IdempotencyRow).where(IdempotencyRow.key == "peer-tunnel-2"))
            digest = row.request_hash
            key = idem.server_key(SqlUnitOfWork(session))
    finally:
        engine.dispose()
    body = TunnelIn.model_validate(tunnel(PSK_A)).to_domain()
    assert digest == idem.fingerprint(body, key=key)
    assert PSK_A not in digest
    assert hashlib.sha256(PSK_A.encode()).hexdigest() not in idem.canonical(body, key=key)
    assert idem.fingerprint(body, key=key) != idem.fingerprint(body, key=b"another database's key" * 2)
    other = TunnelIn.model_validate(tunnel(PSK_B)).to_domain()
    assert idem.fingerprint(body, key=key) != idem.fingerprint(other, key=key)


def test_the_server_key_is_made_once_per_database(session_factory: object) -> None:
    units = sql_units_of_work(session_factory)  # type: ignore[arg-type]
    with units() as uow:
        first = idem.server_key(uow)
        uow.commit()
    with units() as uow:
        second = idem.server_key(uow)
    assert first == second
    assert len(first) >= 32
