"""POST/GET/DELETE /v1/tunnels against two real charons (kernel-libipsec) in network namespaces."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

import httpx
import pytest

from app.adapters.vici.gateway import ViciGateway
from app.domain.algorithms import CATALOGUE
from app.domain.errors import GatewayRejected
from app.lab.hosts import Lab
from tests.integration.tunnels.conftest import Calls

pytestmark = [pytest.mark.anyio, pytest.mark.charon]

KE = [{"algorithm": "modp2048", "key_exchange": 6, "performance": 6},
      {"algorithm": "prfsha256", "key_exchange": 8, "performance": 8},
      {"algorithm": "prfsha512", "key_exchange": 10, "performance": 7},
      {"algorithm": "prfsha1", "key_exchange": 5, "performance": 9}]

#: ESP suite -> a rating table in which it is the only data-plane choice.
SUITES: dict[str, list[dict[str, Any]]] = {
    "aes128gcm16": [{"algorithm": "aes128gcm16", "confidentiality": 8, "integrity": 8, "performance": 9}],
    "chacha20poly1305": [{"algorithm": "chacha20poly1305", "confidentiality": 10, "integrity": 8, "performance": 8}],
    "aes128-sha256": [{"algorithm": "aes128", "confidentiality": 8, "performance": 8},
                      {"algorithm": "sha256", "integrity": 8, "performance": 8}],
    "aes256-sha512": [{"algorithm": "aes256", "confidentiality": 10, "performance": 8},
                      {"algorithm": "sha512", "integrity": 10, "performance": 8}],
    "3des-sha1": [{"algorithm": "3des", "confidentiality": 3, "performance": 4},
                  {"algorithm": "sha1", "integrity": 5, "performance": 9}],
}


def ping(lab: Lab) -> subprocess.CompletedProcess[str]:
    left, right = lab.host("left"), lab.host("right")
    return subprocess.run(
        ["ip", "netns", "exec", left.netns, "ping", "-c", "2", "-W", "2", "-I", left.inside_address,
         right.inside_address],
        capture_output=True, text=True, timeout=20, check=False,
    )


def leftovers(lab: Lab) -> dict[str, Any]:
    out = {}
    for host in lab.hosts:
        g = ViciGateway(host.vici_socket, 5.0)
        out[host.name] = {"conns": g.list_conns(), "shared": g.get_shared(), "sas": [s.name for s in g.list_sas()]}
    return out


def nothing_left(lab: Lab) -> bool:
    return all(not any(v.values()) for v in leftovers(lab).values())


async def make_table(client: httpx.AsyncClient, name: str, rows: list[dict[str, Any]]) -> None:
    r = await client.post("/v1/rating-tables", json={"name": name, "ratings": rows + KE})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("suite", list(SUITES))
async def test_tunnel_up_verified_pings_and_deletes_clean(client: httpx.AsyncClient, lab: Lab, suite: str) -> None:
    table = f"only-{suite}"
    await make_table(client, table, SUITES[suite])
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "rating_table": table})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["state"] == "up"
    assert tunnel["proposals"]["esp"].startswith(suite)
    assert "psk" not in r.text.lower()

    keywords = suite.split("-")
    expected_encr = CATALOGUE[keywords[0]].sa_name
    expected_integ = CATALOGUE[keywords[1]].sa_name if len(keywords) > 1 else None
    for host in lab.hosts:
        sas = [s for s in ViciGateway(host.vici_socket, 5.0).list_sas() if s.name == tunnel["conn"]]
        assert len(sas) == 1, host.name
        assert sas[0].state == "ESTABLISHED"
        assert sas[0].dh_group == "MODP_2048"
        assert sas[0].prf_alg == CATALOGUE[tunnel["ike"]["prf"]].sa_name
        assert sas[0].encr_alg == CATALOGUE[tunnel["ike"]["encryption"]].sa_name
        (child,) = sas[0].children
        assert child.state == "INSTALLED"
        assert child.encr_alg == expected_encr
        assert child.integ_alg == expected_integ

    assert ping(lab).returncode == 0
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["live"]["child_state"] == "INSTALLED"
    assert shown["live"]["packets_out"] >= 2

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)
    assert (await client.get(f"/v1/tunnels/{tunnel['id']}")).status_code == 404


@pytest.mark.parametrize("reports", [True, False], ids=["reports", "list-sas"])
async def test_each_end_is_verified_by_charons_report_or_else_by_list_sas(
        client: httpx.AsyncClient, calls: Calls, settings: Any, lab: Lab, reports: bool) -> None:
    """With reports on, an end whose child-updown report came (normally all of them) is not
    asked with list-sas; with them off, both ends of every tunnel are."""
    settings.sa_reports = reports
    hub = client.qoss_app.state.runtime.sa_events  # type: ignore[attr-defined]
    for _ in range(3):  # one after the other: they protect the same selectors
        r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
        assert r.status_code == 201, r.text
        assert (await client.delete(f"/v1/tunnels/{r.json()['id']}")).status_code == 204
    if reports:
        assert hub.reported + hub.missed == 6
        assert hub.reported >= 1, "no report of charon was read"
        assert calls.count("list_sas") == hub.missed
        metrics = (await client.get("/metrics")).text
        assert f'qoss_sa_reports_total{{outcome="reported"}} {float(hub.reported)}' in metrics
    else:
        assert (hub.reported, hub.missed) == (0, 0)
        assert calls.count("list_sas") == 6
    assert nothing_left(lab), leftovers(lab)


async def test_unsatisfiable_minimums_are_409_with_zero_loads(client: httpx.AsyncClient, lab: Lab,
                                                               calls: Calls) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "rating_table": "esaf-2006", "min_levels": {"integrity": 9}})
    assert r.status_code == 409
    assert r.json()["error"] == "NoFeasibleSuite"
    assert calls.count("load_conn") == 0
    assert calls.count("load_shared") == 0
    assert nothing_left(lab)


async def test_peer_refusing_the_proposal_is_502_and_leaves_nothing(client: httpx.AsyncClient, lab: Lab,
                                                                    settings: Any) -> None:
    # The gateways' records claim a kernel-netlink back end with AES-GMAC; the real charons
    # run kernel-libipsec, which cannot do GMAC: the responder answers NO_PROPOSAL_CHOSEN.
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.adapters.db.repositories import GatewayRepository

    engine = make_engine(settings.database_url)
    with make_session_factory(engine)() as session, session.begin():
        repo = GatewayRepository(session)
        for name in ("left", "right"):
            gw = repo.get(name)
            from dataclasses import replace

            repo.update(replace(gw, algorithms=gw.algorithms | {"aes128gmac"}, backend="kernel-netlink"))
    engine.dispose()
    await make_table(client, "only-gmac", [{"algorithm": "aes128gmac", "confidentiality": 0, "integrity": 8,
                                            "performance": 9},
                                           {"algorithm": "aes128", "confidentiality": 8, "performance": 4},
                                           {"algorithm": "sha256", "integrity": 8, "performance": 4}])
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "rating_table": "only-gmac"})
    assert r.status_code == 502, r.text
    assert r.json()["error"] == "GatewayRejected"
    assert "NO_PROPOSAL_CHOSEN" in r.text
    assert nothing_left(lab), leftovers(lab)
    assert (await client.get("/v1/tunnels")).json() == []


async def test_stopped_charon_is_503_naming_the_socket_then_reconcile_restores(
    client: httpx.AsyncClient, lab: Lab
) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "min_levels": {"confidentiality": 8, "integrity": 8}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    right = lab.host("right")
    lab.stop_charon("right")
    try:
        r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
        assert r.status_code == 503
        assert r.json()["error"] == "GatewayUnreachable"
        assert right.vici_socket in r.text
        assert [c for c in ViciGateway(lab.host("left").vici_socket, 5).list_conns()
                if c != tunnel["conn"]] == []
    finally:
        lab.start_charon("right")
    # The restarted charon knows nothing: reconcile restores the tunnel with a fresh PSK.
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert report["restored"] == [tunnel["id"]]
    assert ping(lab).returncode == 0
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["state"] == "up"
    assert shown["live"]["child_state"] == "INSTALLED"


async def test_reconcile_removes_orphan_conns(client: httpx.AsyncClient, lab: Lab) -> None:
    left = ViciGateway(lab.host("left").vici_socket, 5)
    left.load_conn("qoss-orphan1", {"version": "2", "local_addrs": ["10.99.0.1"], "remote_addrs": ["10.99.0.2"],
                                    "proposals": ["aes128-sha256-modp2048"],
                                    "local": {"auth": "psk"}, "remote": {"auth": "psk"}})
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert "left:qoss-orphan1" in report["orphans_removed"]
    assert "qoss-orphan1" not in left.list_conns()


async def test_reconcile_leaves_the_tunnel_agents_conns_and_secrets_alone(client: httpx.AsyncClient, lab: Lab) -> None:
    """The agent shares the charons: its ``qoss-agent-*`` conns are its own, never orphans of ours."""
    left = ViciGateway(lab.host("left").vici_socket, 5)
    conn = {"version": "2", "local_addrs": ["10.99.0.1"], "remote_addrs": ["%any"],
            "proposals": ["aes128-sha256-modp2048"], "local": {"auth": "psk"}, "remote": {"auth": "psk", "id": "alice"}}
    agent_conn = "qoss-agent-0123456789abcdef"
    left.load_conn(agent_conn, conn)
    left.load_shared(agent_conn, "agent-session-key-" + "k" * 32, ["alice", "10.99.0.1"])
    left.load_conn("qoss-orphan2", conn)
    try:
        report = (await client.post("/v1/tunnels/reconcile")).json()
        assert "left:qoss-orphan2" in report["orphans_removed"]
        assert not [o for o in report["orphans_removed"] if "qoss-agent-" in o]
        assert agent_conn in left.list_conns()
        assert agent_conn in left.get_shared()
    finally:
        with contextlib.suppress(GatewayRejected):
            left.unload_conn(agent_conn)
        with contextlib.suppress(GatewayRejected):
            left.unload_shared(agent_conn)


async def test_unknown_gateway_is_404_and_bad_selector_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "nowhere"})
    assert r.status_code == 404
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "local_ts": ["10.1.0.300/32"]})
    assert r.status_code == 422


async def test_service_start_reconciles_after_a_charon_restart(client: httpx.AsyncClient, lab: Lab,
                                                               settings: Any) -> None:
    from app.main import create_app

    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    lab.stop_charon("left")
    lab.start_charon("left")
    assert tunnel["conn"] not in ViciGateway(lab.host("left").vici_socket, 5).list_conns()
    restarted = create_app(settings.model_copy(update={"reconcile_on_start": True}))
    async with restarted.router.lifespan_context(restarted):
        pass
    assert tunnel["conn"] in ViciGateway(lab.host("left").vici_socket, 5).list_conns()
    assert ping(lab).returncode == 0


async def test_idempotency_key_makes_one_tunnel_for_retries(client: httpx.AsyncClient, lab: Lab) -> None:
    body = {"initiator": "left", "responder": "right", "min_levels": {"integrity": 5}}
    headers = {"Idempotency-Key": "retry-me-1"}
    first = await client.post("/v1/tunnels", json=body, headers=headers)
    assert first.status_code == 201, first.text
    again = await client.post("/v1/tunnels", json=body, headers=headers)
    assert again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    other = await client.post("/v1/tunnels", json={**body, "min_levels": {"integrity": 8}}, headers=headers)
    assert other.status_code == 422
    conns = ViciGateway(lab.host("left").vici_socket, 5).list_conns()
    assert [c for c in conns if c.startswith("qoss-")] == [first.json()["conn"]]
    assert len((await client.get("/v1/tunnels")).json()) == 1


async def test_failed_request_releases_its_idempotency_key(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "retry-me-2"}
    bad = {"initiator": "left", "responder": "right", "rating_table": "esaf-2006", "min_levels": {"integrity": 9}}
    assert (await client.post("/v1/tunnels", json=bad, headers=headers)).status_code == 409
    again = await client.post("/v1/tunnels", json=bad, headers=headers)
    assert again.status_code == 409
    assert again.json()["error"] == "NoFeasibleSuite"  # ran again; not "in progress"
