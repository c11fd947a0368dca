"""200 concurrent tunnel requests against real charon: every one answered, none lost or duplicated."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import pytest

from app.adapters.db import audit_chain
from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import prepare_database
from app.domain import audit_chain as chain
from app.lab.hosts import Lab
from app.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.charon]

N = 200


@pytest.fixture
def settings(tmp_path: Path, lab: Lab) -> Settings:
    """All 200 admitted at once (admission control would turn most away with 503, as it should:
    tests/api/test_overload.py), and no pool or write-slot timeout: this test is about correctness under
    concurrency."""
    settings = Settings(database_url=f"sqlite:///{tmp_path}/qoss.db", vici_socket_dirs=[lab.state_dir],
                        reconcile_on_start=False, max_in_flight=N + 50, db_pool_timeout=30, write_wait_timeout=60)
    prepare_database(settings)
    return settings


def _written_once_each(client: httpx.AsyncClient, ids: set[str]) -> None:
    """Each set-up's record committed with exactly one event and one audit entry, the chain whole,
    and the records written in groups (SQLite's one writer: app.adapters.db.write_groups)."""
    parts = client.qoss_app.state.runtime  # type: ignore[attr-defined]
    groups = parts.write_groups
    assert groups is not None
    assert groups.writes == len(ids)
    assert groups.groups < groups.writes  # set-ups that waited at once shared a transaction
    with parts.units() as uow:
        created = uow.events.after(0, scopes=None, limit=10 * N, kinds={"tunnel.created"})
        audited = uow.audit.list(limit=10 * N, outcome=201, action="POST")
    assert sorted(e["subject"] for e in created) == sorted(ids)
    assert len([a for a in audited if a["object"] == "/v1/tunnels"]) == len(ids)
    with parts.session_factory() as session:
        report = chain.verify(audit_chain.entries(session), head=audit_chain.head(session),
                              key=audit_chain.writer_of(session.get_bind()).key)
    assert report.broken is None


def local_ts(i: int) -> str:
    return f"10.10.{i // 250}.{i % 250 + 1}/32"


async def test_200_concurrent_tunnel_requests(client: httpx.AsyncClient, lab: Lab) -> None:
    left, right = lab.host("left"), lab.host("right")
    batch = "".join(f"addr add {local_ts(i)} dev lo\n" for i in range(N))
    subprocess.run(["ip", "-n", left.netns, "-batch", "-"], input=batch, text=True, check=True, timeout=60)
    lab.stop_charon("left")  # charon reads all addresses at start (a burst of netlink events can be lost)
    lab.start_charon("left")

    async def one(i: int) -> httpx.Response:
        return await client.post("/v1/tunnels", json={
            "initiator": "left", "responder": "right", "local_ts": [local_ts(i)],
            "remote_ts": [f"{right.inside_address}/32"]})

    answers = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(N))), timeout=240)
    assert [r.status_code for r in answers] == [201] * N, {r.status_code: r.text for r in answers}
    ids = {r.json()["id"] for r in answers}
    assert len(ids) == N
    records = {t["conn"] for t in (await client.get("/v1/tunnels?limit=1000")).json()}
    assert len(records) == N
    _written_once_each(client, ids)
    for host in (left, right):
        conns = {c for c in ViciGateway(host.vici_socket, 10).list_conns() if c.startswith("qoss-")}
        assert conns == records, host.name
    deleted = await asyncio.wait_for(
        asyncio.gather(*(client.delete(f"/v1/tunnels/{tid}") for tid in ids)), timeout=240)
    assert [r.status_code for r in deleted] == [204] * N
    for host in (left, right):
        assert [c for c in ViciGateway(host.vici_socket, 10).list_conns() if c.startswith("qoss-")] == []
