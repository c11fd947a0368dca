"""An edit's dry run names the agent sessions it would leave below their minimums, beside the
tunnels (the answer's ``sessions`` part; ``impact`` stays the tunnels' list)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.db.engine import make_engine, make_session_factory
from app.domain.agent.ports import AgentSession
from app.settings import Settings

pytestmark = pytest.mark.anyio

_SUPPORTS = ["aes128gcm16", "aes256gcm16", "chacha20poly1305", "prfsha256", "sha256", "x25519"]


def _record_session(settings: Settings, ticket: str) -> None:
    """An active session as Target records it at connect (its provenance included), on aes128gcm16."""
    inputs = {"objective_id": 3, "min_levels": {"confidentiality": 6}, "supports": _SUPPORTS, "ah": False,
              "transport": False, "policy": None, "rating_table": None, "target_supports": _SUPPORTS,
              "backend": "kernel-netlink"}
    session = AgentSession(
        ticket=ticket, user_id="alice", host_id="hq", request_id="00" * 16, objective_id=3, protection="esp",
        conn=f"qoss-agent-{ticket[:16]}", pool=None, virtual_ip="10.3.8.1", client_identity=f"{ticket[:12]}.alice",
        suite={"protocol": "esp", "encryption": "aes128gcm16", "integrity": None, "key_exchange": "x25519",
               "aead": True, "proposals": {"esp": "aes128gcm16-x25519", "ah": None,
                                           "ike": "aes128gcm16-prfsha256-x25519"}},
        state="active", expires_at=datetime.now(UTC) + timedelta(minutes=5),
        provenance={"request": inputs, "tables": {"standards-2026": 1}, "policy_revision": None, "cost": 0.1})
    engine = make_engine(settings.database_url)
    try:
        with SqlAgentStore(make_session_factory(engine)).unit() as uow:
            uow.sessions.add(session)
            uow.commit()
    finally:
        engine.dispose()


async def test_a_dry_run_names_the_session_it_would_leave_below_its_minimums(client: httpx.AsyncClient,
                                                                             settings: Settings) -> None:
    ticket = "ab" * 16
    _record_session(settings, ticket)
    revision = int((await client.get("/v1/rating-tables/standards-2026")).headers["ETag"].strip('"'))
    r = await client.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16", params={"dry_run": "true"},
                           json={"confidentiality": 3, "reason": "test: broken"},
                           headers={"If-Match": f'"{revision}"'})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["impact"] == []  # the tunnels' part, as before
    [session] = body["sessions"]
    assert (session["ticket"], session["user"], session["objective_id"], session["kind"]) == (
        ticket, "alice", 3, "noncompliant")
    assert session["old"]["proposals"]["esp"] == "aes128gcm16-x25519"
    assert session["new"]["proposals"]["esp"] != "aes128gcm16-x25519"
    # Nothing kept.
    assert (await client.get("/v1/rating-tables/standards-2026")).headers["ETag"] == f'"{revision}"'
