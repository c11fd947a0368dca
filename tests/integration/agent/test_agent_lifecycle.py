"""Agent gaps closed against real charon: Host's per-user rate limit, Target's own revocation list,
and reconcile of a session whose conn vanished when Target's charon restarted.

The charon-restart test is last in this module: it restarts the ``right`` charon.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, select, update
from sqlalchemy.exc import OperationalError

from app.adapters.agent.crypto import CRYPTO
from app.adapters.agent.transport import RemoteRefused, post_message
from app.adapters.db import agent_store
from app.adapters.db.agent_rows import AgentLeaseRow, AgentRevocationRow, AgentSessionRow, AgentUserRow
from app.adapters.db.hot import HotStatement, HotTransaction
from app.adapters.db.models import utcnow
from app.adapters.vici.gateway import Pipeline, ViciGateway
from app.domain.agent import Kind, RequestInfo, b64e, target_conn
from app.domain.agent.ports import AgentRequest, AgentUnitOfWork
from app.domain.charon_port import CharonCommand, LoadPool
from app.domain.ratelimit import RateLimiter
from app.services.agent.client import AgentClient
from app.services.agent.target import TargetAgent
from app.services.agent.target_sessions import RECONCILE_GRACE
from tests.integration.agent.conftest import AgentEnv

pytestmark = pytest.mark.charon

REJECTED = {"error": "AgentRejected", "detail": "the request was rejected"}


@pytest.fixture
def engine(agent_env: AgentEnv) -> Iterator[Engine]:
    engine = create_engine(agent_env.settings.database_url)
    try:
        yield engine
    finally:
        engine.dispose()


def post(env: AgentEnv, wire: bytes) -> httpx.Response:
    return httpx.post(f"{env.url}/v1/agent/requests", json={"message": wire.decode("ascii")}, timeout=30)


def bogus_disconnect(client: AgentClient) -> bytes:
    """A genuine, signed request (a disconnect of a ticket Target never issued): Host charges the user."""
    _, wire = client.request(Kind.DISCONNECT, RequestInfo(target="hq", ticket="0" * 32), 3)
    return wire


def audit_for(env: AgentEnv, n: int) -> list[dict[str, object]]:
    return [a for a in env.audit() if a["object"] == "/v1/agent/requests"][:n]


# --------------------------------------------------------------------------- rate limit


def test_per_user_rate_limit_answers_429_with_retry_after(agent_env: AgentEnv) -> None:
    app = agent_env.server.config.app
    state = app.state.runtime  # type: ignore[attr-defined]
    agent_env.enroll("hasty", [3])
    agent_env.enroll("calm", [3])
    hasty, calm = agent_env.client("hasty"), agent_env.client("calm")
    before = state.agent_user_limiter
    state.agent_user_limiter = RateLimiter(rate=0.01, burst=2)  # 2 at once, then one per 100 s
    try:
        for _ in range(2):  # within the burst: Host passes them on, Target refuses the unknown ticket
            r = post(agent_env, bogus_disconnect(hasty))
            assert r.status_code == 403, r.text
        limited = bogus_disconnect(hasty)
        r = post(agent_env, limited)
        assert r.status_code == 429, r.text
        assert r.json() == {"error": "RateLimited", "detail": "rate limit exceeded for this user"}
        assert 1 <= int(r.headers["Retry-After"]) <= 100
        record = audit_for(agent_env, 1)[0]
        assert record["outcome"] == 429
        assert record["detail"] == "rate limited: user=hasty"
        # Per user: another user from the same address is not limited.
        r = post(agent_env, bogus_disconnect(calm))
        assert r.status_code == 403, r.text
        assert "ticket unknown" in str(audit_for(agent_env, 1)[0]["detail"])
        assert agent_env.target_config_empty()
    finally:
        state.agent_user_limiter = before
    # The limited request's nonce was not spent: sent again later, it is checked like any other.
    r = post(agent_env, limited)
    assert r.status_code == 403, r.text
    assert "ticket unknown" in str(audit_for(agent_env, 1)[0]["detail"])


def test_forged_requests_do_not_spend_a_users_budget(agent_env: AgentEnv) -> None:
    """The per-user limit is charged only after the signature check: an impostor cannot exhaust it."""
    state = agent_env.server.config.app.state.runtime  # type: ignore[attr-defined]
    agent_env.enroll("victim", [3])
    victim = agent_env.client("victim")
    impostor_keys = agent_env.keygen("victim-impostor")
    before = state.agent_user_limiter
    state.agent_user_limiter = RateLimiter(rate=0.01, burst=1)
    try:
        impostor = AgentClient(config=victim.config, keys=impostor_keys, crypto=CRYPTO, vici=victim.vici,
                               post=post_message)
        for _ in range(3):
            r = post(agent_env, bogus_disconnect(impostor))
            assert r.status_code == 403
            assert "bad signature" in str(audit_for(agent_env, 1)[0]["detail"])
        r = post(agent_env, bogus_disconnect(victim))
        assert r.status_code == 403  # not 429: the genuine user still has their request
        assert "ticket unknown" in str(audit_for(agent_env, 1)[0]["detail"])
    finally:
        state.agent_user_limiter = before


# --------------------------------------------------------------------------- Target's revocation list


def test_target_refuses_a_revoked_user_even_when_host_forgets(agent_env: AgentEnv, engine: Engine) -> None:
    """Host revokes dave: Target records it. Host's record is then lost (a restored backup, a bug):
    Host endorses dave again, and Target refuses on its own. Re-enrolled with new keys, dave is
    accepted again."""
    old_keys = agent_env.enroll("dave", [3])
    dave = agent_env.client("dave")
    r = httpx.delete(f"{agent_env.url}/v1/agent/users/dave", headers=agent_env.admin, timeout=30)
    assert r.status_code == 200, r.text
    with engine.connect() as conn:
        row = conn.execute(select(AgentRevocationRow).where(AgentRevocationRow.user_id == "dave")).one()
    assert row.sign_public_key == b64e(old_keys.public.sign)
    assert row.host_id == "hq"

    with engine.begin() as conn:  # Host is wrong: dave looks enrolled and not revoked
        conn.execute(update(AgentUserRow).where(AgentUserRow.user_id == "dave").values(revoked_at=None))
    r = post(agent_env, dave.request(Kind.CONNECT, RequestInfo(target="hq"), 3)[1])
    assert r.status_code == 403, r.text
    assert r.json() == REJECTED
    record = audit_for(agent_env, 1)[0]
    assert "target rejected: user dave was revoked (Target's own list)" in str(record["detail"])
    assert agent_env.target_config_empty()

    # Revoked properly again, then re-enrolled with new keys: the old key stays refused, the new one works.
    r = httpx.delete(f"{agent_env.url}/v1/agent/users/dave", headers=agent_env.admin, timeout=30)
    assert r.status_code == 200, r.text
    agent_env.enroll("dave", [3], keys=agent_env.keygen("dave"))
    report = agent_env.client("dave").connect(target="hq", objective_id=3)
    try:
        assert report["conn"] in agent_env.target_vici.list_conns()
    finally:
        agent_env.client("dave").disconnect()
    assert agent_env.target_config_empty()


def test_revocation_list_survives_a_replayed_revocation(agent_env: AgentEnv) -> None:
    """A revocation is single-use like every message; recording it twice changes nothing."""
    keys = agent_env.enroll("erin", [3])
    r = httpx.delete(f"{agent_env.url}/v1/agent/users/erin", headers=agent_env.admin, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.delete(f"{agent_env.url}/v1/agent/users/erin", headers=agent_env.admin, timeout=30)
    assert r.json()["targets"] == {"hq": "confirmed: 0 tunnels closed"}
    # Target's own list, over HTTP (scope tunnels:read): one entry, the public signing key only.
    r = httpx.get(f"{agent_env.url}/v1/agent/revocations", headers=agent_env.admin, timeout=30)
    assert r.status_code == 200, r.text
    (entry,) = [e for e in r.json() if e["user_id"] == "erin"]
    assert set(entry) == {"user_id", "sign_public_key", "host", "revoked_at"}
    assert (entry["sign_public_key"], entry["host"]) == (b64e(keys.public.sign), "hq")
    assert httpx.get(f"{agent_env.url}/v1/agent/revocations", timeout=30).status_code == 401


def test_an_orphaned_agent_conn_is_unloaded_by_the_second_reconcile_that_sees_it(
    agent_env: AgentEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conn no session owns may be another process's, loaded while its session commits: the
    first reconcile that sees it leaves it, the next one unloads it (with secret and pool)."""
    target: TargetAgent = agent_env.server.config.app.state.runtime.agent_target  # type: ignore[attr-defined]
    monkeypatch.setattr(target, "sweep", lambda: [])  # the server's sweeper stays out of this test
    v, name = agent_env.target_vici, "qoss-agent-0123456789abcdef"
    right = agent_env.lab.host("right")
    v.load_pool(name, "10.3.0.14/32")
    v.load_shared(name, b"k" * 32, ["orphan.target", "orphan.client"])
    v.load_conn(name, target_conn(name=name, target_address=right.ike_address, target_identity="orphan.target",
                                  client_identity="orphan.client", client_address="10.99.0.1",
                                  local_ts=[f"{right.inside_address}/32"], pool=name,
                                  ike_proposal="aes128-sha256-x25519", esp_proposal="aes128gcm16", mode="tunnel",
                                  ike_lifetime=3600, child_lifetime=1200))
    assert target.reconcile().orphans == []
    assert name in v.list_conns()
    assert target.reconcile().orphans == [name]
    assert agent_env.target_config_empty()


# --------------------------------------------------------------------------- Target's load overlaps its commit


def test_a_failed_commit_leaves_nothing_in_charon_and_reconcile_spares_the_load(
    agent_env: AgentEnv, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Target loads pool, secret and conn while the session's transaction commits. The commit fails
    (after the conn is in charon, and after a reconcile ran meanwhile): everything loaded is
    unloaded, and the lease and session were never recorded. The reconcile did not take the
    conn being set up for an orphan."""
    target: TargetAgent = agent_env.server.config.app.state.runtime.agent_target  # type: ignore[attr-defined]
    agent_env.enroll("gina", [3])
    gina = agent_env.client("gina")
    seen: dict[str, Any] = {}

    reconciling = threading.Event()  # reconcile has read charon and the conns in flight

    def reconcile() -> None:
        seen["reconciled"] = target.reconcile()

    gina_conn = HotStatement(lambda _: select(AgentSessionRow.conn).where(AgentSessionRow.user_id == "gina"))

    class FailingCommit(HotTransaction):
        """The Target's write transaction, whose commit fails once gina's session is written."""

        def commit(self) -> None:
            row = None if "conn" in seen else self.cursor.first(gina_conn, {})  # written in this transaction
            if row is None:
                super().commit()
                return
            conn = seen["conn"] = row[0]
            deadline = time.monotonic() + 5
            while conn not in agent_env.target_vici.list_conns() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen["loaded"] = conn in agent_env.target_vici.list_conns()
            # A sweep's reconcile meanwhile (it waits for the database while this transaction holds it).
            seen["thread"] = threading.Thread(target=reconcile, name="test-reconcile")
            seen["thread"].start()
            reconciling.wait(5)
            self.rollback()
            raise OperationalError("COMMIT", None, sqlite3.OperationalError("disk I/O error"))

    book = target._book
    store = book._store

    class Watched:
        """The Target's store, telling when the reconcile opens its unit of work."""

        def unit(self) -> AgentUnitOfWork:
            if threading.current_thread().name == "test-reconcile":
                reconciling.set()
            return store.unit()

        def request(self) -> AgentRequest:
            return store.request()

    book._store = Watched()
    monkeypatch.setattr(agent_store, "HotTransaction", FailingCommit)
    try:
        with pytest.raises(RemoteRefused):
            gina.connect(target="hq", objective_id=3)
    finally:
        book._store = store
        monkeypatch.undo()
        if "thread" in seen:
            seen["thread"].join(10)
    assert seen["loaded"], "the load did not overlap the commit"
    assert seen["reconciled"].orphans == []
    assert agent_env.target_config_empty()
    with engine.connect() as conn:
        assert conn.execute(select(AgentSessionRow).where(AgentSessionRow.user_id == "gina")).all() == []
        prefix = str(seen["conn"]).removeprefix("qoss-agent-")
        assert conn.execute(select(AgentLeaseRow).where(AgentLeaseRow.ticket.startswith(prefix))).all() == []
    report = gina.connect(target="hq", objective_id=3)  # and the next one works
    try:
        assert report["conn"] in agent_env.target_vici.list_conns()
    finally:
        gina.disconnect()
    assert agent_env.target_config_empty()


def test_a_load_charon_refuses_fails_the_connect_and_unloads_the_others(
    agent_env: AgentEnv, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Target loads secret and conn while the session is written and the pool once its address
    is leased. Real charon refuses the pool (an address it cannot parse): the client gets 502,
    the secret and conn already loaded are unloaded, the session ends as failed with charon's
    reason, and its lease is released."""
    target: TargetAgent = agent_env.server.config.app.state.runtime.agent_target  # type: ignore[attr-defined]
    real = target._charon._vici

    def unparsable(commands: Sequence[CharonCommand]) -> list[CharonCommand]:
        return [dataclasses.replace(c, addrs="10.3.0.999/32") if isinstance(c, LoadPool) else c for c in commands]

    class RefusingPipeline(Pipeline):
        def send(self, commands: Sequence[CharonCommand]) -> None:
            super().send(unparsable(commands))

    class RefusedPool(ViciGateway):
        def batch(self, commands: Sequence[CharonCommand]) -> list[Any]:
            return super().batch(unparsable(commands))

        def pipeline(self) -> Pipeline:
            return RefusingPipeline(self)

    monkeypatch.setattr(target._charon, "_vici", lambda path: RefusedPool(real(path).socket_path, 20.0))
    agent_env.enroll("hank", [3])
    with pytest.raises(RemoteRefused) as info:
        agent_env.client("hank").connect(target="hq", objective_id=3)
    assert info.value.status == 502
    assert "load-pool" in str(info.value.detail())
    assert agent_env.target_config_empty()
    with engine.connect() as conn:
        (ticket, state, reason), = conn.execute(select(
            AgentSessionRow.ticket, AgentSessionRow.state, AgentSessionRow.reason).where(
            AgentSessionRow.user_id == "hank")).all()
        assert state == "failed"
        assert reason.startswith("charon: load-pool")
        assert conn.execute(select(AgentLeaseRow).where(AgentLeaseRow.ticket == ticket)).all() == []


# --------------------------------------------------------------------------- reconcile (last: restarts charon)


def test_reconcile_ends_a_session_whose_conn_vanished_with_a_charon_restart(
    agent_env: AgentEnv, engine: Engine
) -> None:
    agent_env.enroll("frank", [3])
    frank = agent_env.client("frank")
    report = frank.connect(target="hq", objective_id=3)
    ticket = report["ticket"]
    with engine.begin() as conn:  # the session is older than the grace reconcile gives a load in progress
        conn.execute(update(AgentSessionRow).where(AgentSessionRow.ticket == ticket)
                     .values(created_at=utcnow() - timedelta(seconds=RECONCILE_GRACE + 5)))
        assert conn.execute(select(AgentLeaseRow).where(AgentLeaseRow.ticket == ticket)).one_or_none()
    agent_env.lab.stop_charon("right")
    agent_env.lab.start_charon("right")
    assert report["conn"] not in agent_env.target_vici.list_conns()

    deadline = time.monotonic() + 15  # the sweeper reconciles every 10th sweep (0.2 s apart)
    state = "active"
    while time.monotonic() < deadline and state == "active":
        time.sleep(0.2)
        with engine.connect() as conn:
            state = conn.execute(select(AgentSessionRow.state).where(AgentSessionRow.ticket == ticket)).scalar_one()
    assert state == "failed"
    with engine.connect() as conn:
        reason = conn.execute(select(AgentSessionRow.reason).where(AgentSessionRow.ticket == ticket)).scalar_one()
        assert "vanished" in reason
    # The lease is released after the state changes, once charon has let go of the address.
    lease = True
    while time.monotonic() < deadline + 10 and lease:
        with engine.connect() as conn:
            lease = conn.execute(select(AgentLeaseRow).where(AgentLeaseRow.ticket == ticket)).one_or_none() is not None
        if lease:
            time.sleep(0.1)
    assert not lease
    assert agent_env.target_config_empty()

    # A fresh session on the restarted charon is not touched by reconcile.
    frank.disconnect()  # the client's own side; Target answers that the ticket is gone
    fresh = frank.connect(target="hq", objective_id=3)
    try:
        target: TargetAgent = agent_env.server.config.app.state.runtime.agent_target  # type: ignore[attr-defined]
        assert target.reconcile().vanished == []
        assert fresh["conn"] in agent_env.target_vici.list_conns()
    finally:
        frank.disconnect()
    assert agent_env.target_config_empty()
