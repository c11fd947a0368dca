"""A mobile user gets a real tunnel through Host and Target, and loses it again."""

from __future__ import annotations

import dataclasses
import ipaddress
import subprocess
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest

from app.adapters.vici.gateway import Pipeline, wire_form
from app.domain.charon_port import CharonCommand, Initiate
from app.domain.errors import GatewayRejected
from tests.integration.agent.conftest import POOL, AgentEnv

pytestmark = pytest.mark.charon


def ping(env: AgentEnv, source: str) -> subprocess.CompletedProcess[str]:
    left, right = env.lab.host("left"), env.lab.host("right")
    return subprocess.run(
        ["ip", "netns", "exec", left.netns, "ping", "-c", "2", "-W", "1", "-I", source, right.inside_address],
        capture_output=True, text=True, timeout=15, check=False,
    )


def test_connect_ping_disconnect(agent_env: AgentEnv) -> None:
    agent_env.enroll("alice", [2, 3, 4])
    client = agent_env.client("alice")
    report = client.connect(target="hq", objective_id=3, min_levels={"confidentiality": 5, "integrity": 5})
    try:
        assert report["protection"] == "esp"
        vip = report["virtual_ip"]
        assert vip is not None
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
        done = ping(agent_env, vip)
        assert done.returncode == 0, done.stdout + done.stderr
        sas = agent_env.target_vici.list_sas(ike=report["conn"])
        assert len(sas) == 1
        assert sas[0].state == "ESTABLISHED"
        assert sas[0].remote_vips == (vip,)
    finally:
        closed = client.disconnect(report["ticket"])
    assert closed == [report["ticket"]]
    assert agent_env.target_config_empty()
    assert report["conn"] not in agent_env.client_vici.list_conns()
    assert client.tunnels() == []


@pytest.mark.parametrize("objective", [1, 2, 3, 4])
def test_objective_ids_give_table_2_2_protection(agent_env: AgentEnv, objective: int) -> None:
    """Liu et al. Table 2-2 on a kernel-libipsec Target: 1 Native (no tunnel), 2 AH -> ESP-NULL with
    integrity, 3 ESP, 4 AH+ESP -> ESP with integrity; each fallback is reported."""
    user = f"obj{objective}"
    agent_env.enroll(user, [objective])
    client = agent_env.client(user)
    report = client.connect(target="hq", objective_id=objective)
    try:
        suite = report["suite"]
        notes = " ".join(report["notes"])
        if objective == 1:
            assert report["protection"] == "native"
            assert suite["protocol"] == "none"
            assert report["conn"] is None
            assert agent_env.target_config_empty()
            return
        assert report["protection"] == "esp"
        assert suite["protocol"] == "esp"
        sas = agent_env.target_vici.list_sas(ike=report["conn"])
        child = sas[0].children[0]
        assert child.protocol == "ESP"
        if objective == 2:
            assert suite["encryption"] == "null"
            assert child.encr_alg == "NULL"
            assert child.integ_alg is not None
            assert "AH" in notes
        elif objective == 3:
            assert suite["encryption"] not in (None, "null")
            assert child.encr_alg not in (None, "NULL")
        else:
            assert suite["encryption"] not in (None, "null")
            assert suite["integrity"] is not None or suite["aead"]
            assert "AH" in notes
        assert ping(agent_env, report["virtual_ip"]).returncode == 0
    finally:
        client.disconnect()
    assert agent_env.target_config_empty()


def test_expiry_removes_everything_on_target(agent_env: AgentEnv) -> None:
    """A session past its expiry is ended by Target's sweeper: conn, key, pool and lease gone."""
    from sqlalchemy import create_engine, update

    from app.adapters.db.agent_rows import AgentLeaseRow, AgentSessionRow
    from app.adapters.db.models import utcnow

    agent_env.enroll("carol", [3])
    client = agent_env.client("carol")
    report = client.connect(target="hq", objective_id=3, lifetime=600)
    assert report["conn"] in agent_env.target_vici.list_conns()
    engine = create_engine(agent_env.settings.database_url)
    with engine.begin() as conn:  # fast-forward: the session expired a second ago
        conn.execute(update(AgentSessionRow).where(AgentSessionRow.ticket == report["ticket"])
                     .values(expires_at=utcnow() - timedelta(seconds=1)))
    def leases() -> list[Any]:
        with engine.connect() as conn:
            return list(conn.execute(AgentLeaseRow.__table__.select()).all())

    # The lease is freed only once charon has let go of the address: after the config is gone.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (agent_env.target_config_empty() and leases() == []):
        time.sleep(0.1)
    assert agent_env.target_config_empty()
    assert not agent_env.target_vici.list_sas(ike=report["conn"])
    with engine.connect() as conn:
        row = conn.execute(AgentSessionRow.__table__.select().where(
            AgentSessionRow.ticket == report["ticket"])).mappings().one()
        assert row["state"] == "expired"
        assert conn.execute(AgentLeaseRow.__table__.select()).all() == []
    engine.dispose()
    client.disconnect()  # local clean-up; Target answers that the ticket is gone
    assert report["conn"] not in agent_env.client_vici.list_conns()


def test_connect_is_one_pipelined_exchange_with_charon(agent_env: AgentEnv) -> None:
    """The client's secret, conn, initiate and list-sas go to real charon in one write on one
    connection (charon works through them in order): the tunnel comes up and is checked, and no
    other command follows."""
    agent_env.enroll("gina", [3])
    client = agent_env.client("gina")
    sent: list[list[str]] = []
    make = client.vici.pipeline

    def spy() -> Pipeline:
        pipeline = make()
        send = pipeline.send

        def recording(commands: Sequence[CharonCommand]) -> None:
            sent.append([c.name for c in wire_form(commands)])
            send(commands)

        pipeline.send = recording  # type: ignore[method-assign]
        return pipeline

    client.vici.pipeline = spy  # type: ignore[method-assign]
    for name in ("initiate", "list_sas", "batch"):
        setattr(client.vici, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} outside the pipeline"))
    report = client.connect(target="hq", objective_id=3)
    for name in ("initiate", "list_sas", "batch"):
        delattr(client.vici, name)
    try:
        assert sent == [["load-shared", "load-conn", "initiate", "list-sas"]]
        assert report["virtual_ip"] is not None
        assert ping(agent_env, report["virtual_ip"]).returncode == 0
    finally:
        client.disconnect()
    assert agent_env.target_config_empty()


def test_the_ticket_is_remembered_while_charon_initiates_and_forgotten_if_that_fails(agent_env: AgentEnv) -> None:
    """The ticket's record is written during the initiate: read right after connect it has the
    virtual IP; an initiate that fails leaves no record here and nothing configured at Target."""
    agent_env.enroll("hana", [3])
    client = agent_env.client("hana")
    report = client.connect(target="hq", objective_id=3)
    try:
        [record] = client.tunnels()
        assert record["ticket"] == report["ticket"]
        assert record["virtual_ip"] == report["virtual_ip"] is not None
    finally:
        client.disconnect()
    assert client.tunnels() == []

    make = client.vici.pipeline

    def hurried() -> Pipeline:
        """charon gives up waiting for the tunnel after 1 ms (the IKE_SA goes on in the background)."""
        pipeline = make()
        send = pipeline.send
        pipeline.send = lambda commands: send([  # type: ignore[method-assign]
            dataclasses.replace(c, timeout_ms=1) if isinstance(c, Initiate) else c for c in commands])
        return pipeline

    client.vici.pipeline = hurried  # type: ignore[method-assign]
    with pytest.raises(GatewayRejected, match="initiate"):
        client.connect(target="hq", objective_id=3)
    del client.vici.pipeline
    assert client.tunnels() == []
    assert not [c for c in client.vici.list_conns() if c.startswith("qoss-agent-")]
    assert not [sa for sa in client.vici.list_sas() if sa.name.startswith("qoss-agent-")]
    assert [p.name for p in client.config.state_dir.glob("*.json") if p.name != "capabilities.json"] == []
    assert agent_env.target_config_empty()


def test_a_pool_loaded_on_a_taken_address_is_loaded_again_with_the_leased_one(agent_env: AgentEnv) -> None:
    """Target loads the pool with secret and conn on the address it expects to lease; when another
    session holds that address, the lease takes the next free one and the pool is loaded again
    with it: the client gets its own address, never the other session's, and the tunnel works."""
    from sqlalchemy import create_engine, delete, insert

    from app.adapters.db.agent_rows import AgentLeaseRow
    from app.adapters.db.models import utcnow
    from app.services.agent.target import TargetAgent

    target: TargetAgent = agent_env.server.config.app.state.runtime.agent_target  # type: ignore[attr-defined]
    taken = str(next(ipaddress.ip_network(POOL).hosts()) + 5)
    engine = create_engine(agent_env.settings.database_url)
    with engine.begin() as conn:  # another session's lease
        conn.execute(insert(AgentLeaseRow.__table__).values(address=taken, ticket="f" * 32, created_at=utcnow()))
    target._book._lease_hint = taken
    agent_env.enroll("iris", [3])
    client = agent_env.client("iris")
    try:
        report = client.connect(target="hq", objective_id=3)
        try:
            assert report["virtual_ip"] not in (None, taken)
            assert ipaddress.ip_address(report["virtual_ip"]) in ipaddress.ip_network(POOL)
            pools = {p.name: p for p in agent_env.target_vici.get_pools()}
            assert pools[report["conn"]].base == report["virtual_ip"]
            assert ping(agent_env, report["virtual_ip"]).returncode == 0
        finally:
            client.disconnect()
        assert agent_env.target_config_empty()
    finally:
        with engine.begin() as conn:
            conn.execute(delete(AgentLeaseRow.__table__).where(AgentLeaseRow.ticket == "f" * 32))
        engine.dispose()


def _patch_rating(env: AgentEnv, algorithm: str, changes: dict[str, object], *, dry_run: bool = False
                  ) -> dict[str, Any]:
    url = f"{env.url}/v1/rating-tables/standards-2026"
    revision = httpx.get(url, headers=env.admin, timeout=10).headers["ETag"]
    r = httpx.patch(f"{url}/ratings/{algorithm}", params={"dry_run": "true"} if dry_run else None, json=changes,
                    headers={**env.admin, "If-Match": revision}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _session_record(env: AgentEnv, ticket: str) -> dict[str, Any]:
    r = httpx.get(f"{env.url}/v1/agent/sessions", headers=env.admin, params={"limit": 1000}, timeout=10)
    assert r.status_code == 200, r.text
    [record] = [s for s in r.json() if s["ticket"] == ticket]
    return dict(record)


def test_an_edit_that_leaves_a_session_below_its_minimums_closes_it_and_a_reconnect_gets_a_new_suite(
        agent_env: AgentEnv) -> None:
    """The dry run names exactly that session (old and new suite); the committed edit has Target
    close it with the reason; the client's status says so and to connect again; a new connect
    gets another suite that meets the minimums. The rating is put back at the end."""
    agent_env.enroll("mover", [3])
    client = agent_env.client("mover")
    report = client.connect(target="hq", objective_id=3, min_levels={"confidentiality": 5, "integrity": 5})
    encryption, ticket = report["suite"]["encryption"], report["ticket"]
    table = httpx.get(f"{agent_env.url}/v1/rating-tables/standards-2026", headers=agent_env.admin, timeout=10).json()
    [row] = [r for r in table["ratings"] if r["algorithm"] == encryption]
    weakened = {"confidentiality": 2, "reason": "test: broken"}
    again: dict[str, Any] | None = None
    try:
        preview = _patch_rating(agent_env, encryption, weakened, dry_run=True)
        [session] = [s for s in preview["sessions"] if s["kind"] == "noncompliant"]
        assert (session["ticket"], session["user"]) == (ticket, "mover")
        assert session["old"]["proposals"]["esp"] == report["esp_proposal"]
        assert session["new"]["proposals"]["esp"] != report["esp_proposal"]
        assert _session_record(agent_env, ticket)["state"] == "active"  # nothing kept

        edited = _patch_rating(agent_env, encryption, weakened)
        deadline = time.monotonic() + 15  # Target's sweeper reads the edit from the event log
        while _session_record(agent_env, ticket)["state"] == "active" and time.monotonic() < deadline:
            time.sleep(0.2)
        record = _session_record(agent_env, ticket)
        assert record["state"] == "closed"
        assert record["reason"] == (f"rating table standards-2026 revision {edited['revision']} puts {encryption} "
                                    "below objective 3's minimums: connect again")
        [entry] = [a for a in agent_env.audit() if a["object"] == f"/v1/agent/sessions/{ticket}"]
        assert f"a new connect gets {session['new']['proposals']['esp']}" in entry["detail"]
        assert agent_env.target_vici.list_sas(ike=report["conn"]) == []
        assert report["conn"] not in agent_env.target_vici.list_conns()

        deadline = time.monotonic() + 20  # Target's DELETE reaches the client's charon
        while agent_env.client_vici.list_sas(ike=report["conn"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        [status] = [t for t in client.status() if t["ticket"] == ticket]
        assert status["in_charon"] is False
        assert status["closed"].endswith("connect again")
        assert client.tunnels() == []

        again = client.connect(target="hq", objective_id=3, min_levels={"confidentiality": 5, "integrity": 5})
        assert again["suite"]["encryption"] != encryption
        assert again["esp_proposal"] == session["new"]["proposals"]["esp"]
        [sa] = agent_env.target_vici.list_sas(ike=again["conn"])
        assert sa.state == "ESTABLISHED"
    finally:
        if again is not None:
            client.disconnect(again["ticket"])
        _patch_rating(agent_env, encryption, {"confidentiality": row["confidentiality"], "reason": row.get("reason")})
