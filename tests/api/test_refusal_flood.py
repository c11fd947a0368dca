"""A flood of bad tokens from one address: held back after a burst (429 before any token is
looked up), and recorded as a few audit entries that count it, not one entry and one event each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.adapters.db.audit_log import verify_log
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import AuditRow, EventRow
from app.adapters.db.refusals import more_refusals
from app.adapters.db.repositories import TokenRepository
from app.domain.auth import TokenRecord
from app.main import create_app
from app.settings import Settings

pytestmark = pytest.mark.anyio

ATTACKER = "192.0.2.7"
BAD = {"Authorization": f"Bearer qoss_ffffffffffff_{'A' * 43}"}  # well-formed: each check looks it up


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[Callable[[str], httpx.AsyncClient]]:
    """The app, and a client per source address (the ASGI scope's client)."""
    app = create_app(settings)
    clients: list[httpx.AsyncClient] = []

    def client(address: str) -> httpx.AsyncClient:
        made = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 40_000)),
                                 base_url="http://qoss.test")
        clients.append(made)
        return made

    try:
        async with app.router.lifespan_context(app):
            yield client
    finally:
        for made in clients:
            await made.aclose()


def rows(database_url: str) -> tuple[list[dict[str, Any]], int, bool]:
    """The attacker's audit entries, the number of audit events, and whether the chain verifies."""
    engine = make_engine(database_url)
    try:
        factory = make_session_factory(engine)
        with factory() as session:
            intact = verify_log(session=session).intact  # the check reads one snapshot: a session of its own
        with factory() as session:
            entries = [{"outcome": r.outcome, "detail": r.detail, "object": r.object, "request_id": r.request_id}
                       for r in session.scalars(select(AuditRow).where(AuditRow.source == ATTACKER)
                                                .order_by(AuditRow.id))]
            events = session.scalar(select(func.count()).select_from(EventRow).where(EventRow.kind == "audit"))
        return entries, int(events or 0), intact
    finally:
        engine.dispose()


def counted(entries: list[dict[str, Any]], outcome: int) -> int:
    """How many refusals the entries of ``outcome`` stand for (a summary, the N it counts)."""
    return sum(more_refusals(e["detail"]) or 1 for e in entries if e["outcome"] == outcome)


async def test_300_bad_tokens_from_one_address_are_held_back_and_counted_in_a_few_entries(
    settings: Settings, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str] = []
    find = TokenRepository.find

    def counting_find(self: TokenRepository, token_id: str) -> TokenRecord | None:
        lookups.append(token_id)
        return find(self, token_id)

    monkeypatch.setattr(TokenRepository, "find", counting_find)
    # One failure back every 20 s: the address is still held back when its good token comes, however
    # slowly a loaded machine serves the 300 (at the default of one a second, a pause of a second
    # between the last of them and the next request lets that one through, as it should).
    settings = settings.model_copy(update={"auth_failure_rate": 0.05})
    _, events_before, _ = rows(settings.database_url)
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with served(settings) as client:
        attacker, other = client(ATTACKER), client("198.51.100.9")
        started = time.monotonic()
        answers = [await attacker.post("/v1/policies", json={"name": "x"}, headers=BAD) for _ in range(300)]
        elapsed = time.monotonic() - started
        statuses = [a.status_code for a in answers]
        assert set(statuses) == {401, 429}
        allowed = settings.auth_failure_burst + int(elapsed * settings.auth_failure_rate) + 1
        assert statuses[: settings.auth_failure_burst] == [401] * settings.auth_failure_burst
        assert statuses.count(401) <= allowed, (statuses.count(401), elapsed)
        assert len([x for x in lookups if x == "ffffffffffff"]) == statuses.count(401)  # 429: no lookup
        held = next(a for a in answers if a.status_code == 429)
        assert held.json() == {"error": "RateLimited",
                               "detail": "rate limit exceeded for failed authentications from this address"}
        assert int(held.headers["retry-after"]) >= 1

        # The address is held back whatever token it sends; its requests without one are not.
        assert (await attacker.get("/v1/policies", headers=admin)).status_code == 429
        assert (await attacker.get("/v1/policies")).status_code == 200
        # A good token from another address is not slowed at all.
        assert (await other.get("/v1/policies", headers=admin)).status_code == 200
        assert (await other.post("/v1/policies", json={"name": "flood-ok"}, headers=admin)).status_code == 201

        listed = (await other.get("/v1/audit", params={"limit": 1000}, headers=admin)).json()
        mine = [r for r in listed if r["source"] == ATTACKER]
        # While the window is open: the first of each kind (401 and 429 on POST, 429 on GET).
        assert sorted((r["outcome"], r["action"]) for r in mine) == [(401, "POST"), (429, "GET"), (429, "POST")]
    # Shutdown writes what the open windows counted.
    entries, events_after, intact = rows(settings.database_url)
    assert len(entries) <= 6, entries
    assert counted(entries, 401) == statuses.count(401), entries
    assert counted(entries, 429) == statuses.count(429) + 1  # and the admin token's GET
    assert events_after - events_before <= 7  # the entries above and the admin's one change
    assert intact


async def test_the_count_of_a_window_is_written_when_it_closes(settings: Settings, admin_token: str) -> None:
    admin = {"Authorization": f"Bearer {admin_token}"}
    # A window long enough for the ten refusals to fall in it on a loaded machine too (0.5 s
    # was not: a slow burst opened a second window, and so a third entry).
    async with served(settings.model_copy(update={"audit_refusal_window": 3.0})) as client:
        attacker, reader = client(ATTACKER), client("198.51.100.9")
        started = time.monotonic()
        for _ in range(10):  # within the burst: ten 401s of one kind
            assert (await attacker.delete("/v1/policies/esaf", headers=BAD)).status_code == 401
        assert time.monotonic() - started < 3.0, "the burst outlasted the window: the test proves nothing"

        async def mine() -> list[dict[str, Any]]:
            listed = (await reader.get("/v1/audit", params={"limit": 1000}, headers=admin)).json()
            return [r for r in listed if r["source"] == ATTACKER]

        deadline = time.monotonic() + 15
        entries = await mine()
        while len(entries) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            entries = await mine()
        summary, first = entries  # newest first
        assert (first["outcome"], first["action"], first["object"], first["detail"]) == (
            401, "DELETE", "/v1/policies/esaf", "Unauthenticated")
        assert more_refusals(summary["detail"]) == 9
        assert summary["detail"].startswith(f"9 more refusals like request {first['request_id']} within ")
        assert summary["detail"].endswith("; Unauthenticated")
        assert summary["outcome"] == 401
        assert summary["token_id"] is None
    entries_after, _, intact = rows(settings.database_url)
    assert len(entries_after) == 2
    assert intact


async def test_the_metrics_token_check_is_held_back_too(settings: Settings, admin_token: str) -> None:
    async with served(settings.model_copy(update={"auth_failure_burst": 3, "auth_failure_rate": 0.01})) as client:
        attacker, other = client(ATTACKER), client("198.51.100.9")
        statuses = [(await attacker.get("/metrics", headers=BAD)).status_code for _ in range(10)]
        assert statuses[:3] == [401] * 3
        assert set(statuses[3:]) == {429}
        assert (await other.get("/metrics", headers=BAD)).status_code == 401
        assert (await other.get("/metrics", headers={"Authorization": f"Bearer {admin_token}"})).status_code == 200


@pytest.mark.parametrize("db_backend", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
async def test_replicas_on_one_postgresql_share_the_failures_of_an_address(settings: Settings) -> None:
    """Several replicas share one PostgreSQL (one SQLite database is one process's)."""
    slow = settings.model_copy(update={"auth_failure_burst": 10, "auth_failure_rate": 0.01})
    async with served(slow) as one, served(slow) as two:
        replicas = [one(ATTACKER), two(ATTACKER)]
        statuses = [(await replicas[i % 2].post("/v1/policies", json={}, headers=BAD)).status_code
                    for i in range(60)]
    # The burst once, not once per replica; each replica may check one more before it learns.
    assert statuses[:10] == [401] * 10
    assert statuses.count(401) <= 12
    assert statuses[-20:] == [429] * 20
