"""Faults against real charon and a real database: nothing half-loaded, no secret anywhere."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, select

from app.adapters.db.engine import make_engine
from app.adapters.vici.gateway import ViciGateway
from app.lab.hosts import Lab
from tests.integration.tunnels.conftest import Calls

pytestmark = [pytest.mark.anyio, pytest.mark.charon]


def qoss_conns(lab: Lab, host: str) -> list[str]:
    return [c for c in ViciGateway(lab.host(host).vici_socket, 5).list_conns() if c.startswith("qoss-")]


async def test_charon_killed_during_a_tunnel_request(client: httpx.AsyncClient, lab: Lab, calls: Calls) -> None:
    right = lab.host("right")
    killed: list[str] = []

    def kill_responder(socket_path: str) -> None:
        if socket_path == right.vici_socket and not killed:
            killed.append(socket_path)
            lab.stop_charon("right")

    calls.after_load = kill_responder
    try:
        r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    finally:
        calls.after_load = None
        lab.start_charon("right")
    assert killed
    assert r.status_code in (502, 503), r.text
    assert r.json()["error"] in ("GatewayUnreachable", "GatewayRejected")
    assert qoss_conns(lab, "left") == []
    assert ViciGateway(lab.host("left").vici_socket, 5).get_shared() == []
    assert qoss_conns(lab, "right") == []
    assert (await client.get("/v1/tunnels")).json() == []
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert report["restored"] == []
    assert report["failed"] == {}


async def test_no_secret_in_records_logs_or_answers(
    client: httpx.AsyncClient, lab: Lab, calls: Calls, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    created = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    assert created.status_code == 201
    shown = await client.get(f"/v1/tunnels/{created.json()['id']}")
    audit = await client.get("/v1/audit", params={"limit": 1000})
    deleted = await client.delete(f"/v1/tunnels/{created.json()['id']}")
    assert deleted.status_code == 204
    (psk,) = set(calls.secrets)
    forms = [psk.hex(), base64.b64encode(psk).decode(), base64.urlsafe_b64encode(psk).decode().rstrip("=")]
    engine = make_engine(settings.database_url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        dump = "\n".join(str(row) for table in meta.sorted_tables for row in conn.execute(select(table)))
    engine.dispose()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    charon_logs = "\n".join(Path(h.log_path).read_text(errors="replace") for h in lab.hosts)
    for text in (created.text, shown.text, audit.text, dump, logs, charon_logs):
        for form in forms:
            assert form not in text
    assert psk.decode("latin-1") not in dump
