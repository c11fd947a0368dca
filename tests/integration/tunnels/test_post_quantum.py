"""Post-quantum tunnels against two real charons (strongSwan 5.9.8, kernel-libipsec) in network
namespaces: a post-quantum minimum brings the tunnel up with a PPK on both ends (RFC 8784), none is
paid for unasked, an end that requires a PPK refuses one without, and a policy edit that raises the
minimum moves a running tunnel onto a PPK make-before-break."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import time

import httpx
import pytest

from app.adapters.vici.gateway import ViciGateway
from app.domain.errors import GatewayRejected
from app.domain.tunnels import TunnelEnd, conn_payload
from app.lab.hosts import Lab
from tests.fixtures.secrets import register
from tests.integration.tunnels.conftest import Calls
from tests.integration.tunnels.test_tunnels_api import leftovers, nothing_left, ping

pytestmark = [pytest.mark.anyio, pytest.mark.charon]

LEVELS = {"confidentiality": 8, "integrity": 8}


def swanctl_sas(lab: Lab, conn: str) -> dict[str, str]:
    """``swanctl --list-sas`` of ``conn`` on every charon, as swanctl itself prints it."""
    return {host.name: subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{host.vici_socket}"],
                                      capture_output=True, text=True, timeout=10, check=True).stdout
            for host in lab.hosts}


def ike_line(shown: str) -> str:
    """swanctl's line of an IKE_SA's algorithms (``AES_GCM_16-256/PRF_HMAC_SHA2_384/CURVE_25519[/PPK]``)."""
    return next(line for line in shown.splitlines() if "/PRF_" in line and "INSTALLED" not in line)


async def test_a_post_quantum_minimum_comes_up_with_a_ppk_on_both_ends(client: httpx.AsyncClient, lab: Lab,
                                                                       calls: Calls) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "min_levels": {**LEVELS, "post_quantum": 5}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["state"] == "up"
    assert tunnel["suite"]["post_quantum"] == "ppk"
    assert tunnel["levels"]["post_quantum"] == 9
    for host, shown in swanctl_sas(lab, tunnel["conn"]).items():
        assert ike_line(shown).rstrip().endswith("/PPK"), (host, shown)
        assert "INSTALLED" in shown, (host, shown)
    for host in lab.hosts:
        (sa,) = [s for s in ViciGateway(host.vici_socket, 5.0).list_sas() if s.name == tunnel["conn"]]
        assert sa.ppk, host.name
        # the PSK and the PPK, each under the tunnel's name
        assert sorted(ViciGateway(host.vici_socket, 5.0).get_shared()) == [tunnel["conn"], f"{tunnel['conn']}-ppk"]
    assert ping(lab).returncode == 0
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["live"]["ppk"] is True
    # a fresh 32-byte PPK per tunnel, the same on both ends, never in an answer
    ppks = [s for s in calls.secrets if len(s) == 32]
    assert len(set(ppks)) == 2  # the PSK and the PPK, each loaded on both ends
    assert all(p.hex() not in r.text and p.hex() not in str(shown) for p in ppks)

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)


async def test_the_same_tunnel_without_the_minimum_has_no_ppk(client: httpx.AsyncClient, lab: Lab) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "min_levels": LEVELS})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["suite"]["post_quantum"] is None
    assert tunnel["levels"]["post_quantum"] == 0
    for host, shown in swanctl_sas(lab, tunnel["conn"]).items():
        assert "PPK" not in ike_line(shown), (host, shown)
    for host in lab.hosts:
        assert ViciGateway(host.vici_socket, 5.0).get_shared() == [tunnel["conn"]], host.name
    assert ping(lab).returncode == 0
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)


async def test_a_minimum_no_mechanism_of_both_ends_reaches_is_409_with_nothing_loaded(
        client: httpx.AsyncClient, lab: Lab, calls: Calls) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "min_levels": {"post_quantum": 10}})
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["unmet"] == [
        {"peer": "request", "requirement": "post_quantum", "level": 10, "best_available": 9}]
    assert calls.count("load_shared") == 0
    assert nothing_left(lab), leftovers(lab)


async def test_a_tunnel_to_an_unmanaged_peer_is_refused_a_post_quantum_minimum(client: httpx.AsyncClient,
                                                                                lab: Lab, calls: Calls) -> None:
    right = lab.host("right")
    r = await client.post("/v1/tunnels", json={
        "initiator": "left", "peer": {"address": right.ike_address, "psk": "p" * 40},
        "remote_ts": [f"{right.inside_address}/32"], "min_levels": {"post_quantum": 1}})
    assert r.status_code == 409, r.text
    assert any("not supported by peer" in n for n in r.json()["detail"]["notes"])
    assert calls.count("load_shared") == 0


@pytest.mark.parametrize("requiring", ["right", "left"], ids=["responder-requires", "initiator-requires"])
def test_an_end_that_requires_a_ppk_refuses_a_peer_without_one(lab: Lab, requiring: str) -> None:
    """One end's conn names a PPK with ``ppk_required``, the other has none: no IKE_SA comes up, and
    the end that requires it says why (RFC 8784: it must not fall back to a plain IKE_SA)."""
    name = f"qoss-pqneg-{secrets.token_hex(3)}"
    left, right = lab.host("left"), lab.host("right")
    ends = {"left": TunnelEnd(left.ike_address, f"{name}.left", (f"{left.inside_address}/32",)),
            "right": TunnelEnd(right.ike_address, f"{name}.right", (f"{right.inside_address}/32",))}
    gateways = {"left": ViciGateway(left.vici_socket, 10.0), "right": ViciGateway(right.vici_socket, 10.0)}
    psk, ppk, ppk_id = secrets.token_bytes(32), secrets.token_bytes(32), f"qoss-ppk-{secrets.token_hex(6)}"
    register(psk)
    register(ppk)
    start = _size(lab.host(requiring).log_path)
    try:
        for side, other in (("right", "left"), ("left", "right")):
            g = gateways[side]
            g.load_shared(name, psk, [ends[side].identity, ends[other].identity])
            if side == requiring:
                g.load_shared(f"{name}-ppk", ppk, [ppk_id], "PPK")
            g.load_conn(name, conn_payload(
                name=name, local=ends[side], remote=ends[other], ike_proposal="aes256gcm16-prfsha384-x25519",
                esp_proposal="aes256gcm16", ah_proposal=None, mode="tunnel", ike_lifetime=3600, child_lifetime=3600,
                ppk_id=ppk_id if side == requiring else None))
        with pytest.raises(GatewayRejected):
            gateways["left"].initiate(child=name, ike=name, timeout_ms=8000)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                s.name == name for g in gateways.values() for s in g.list_sas()):
            time.sleep(0.1)
        for side, g in gateways.items():
            assert not [s for s in g.list_sas() if s.name == name and s.state == "ESTABLISHED"], side
        with open(lab.host(requiring).log_path, errors="replace") as log:
            log.seek(start)
            said = log.read()
        assert "PPK required but peer does not support PPK" in said, said[-2000:]
    finally:
        for g in gateways.values():
            # a responder keeps the half-open IKE_SA an initiator gave up on (until its own timeout)
            for half_open in [s for s in g.list_sas() if s.name == "(unnamed)"
                              and {s.local_host, s.remote_host} == {left.ike_address, right.ike_address}]:
                with contextlib.suppress(GatewayRejected, ValueError):
                    g.terminate(ike_id=half_open.uniqueid, timeout_ms=3000, force=True)
            with contextlib.suppress(GatewayRejected, ValueError):
                g.terminate(ike=name, timeout_ms=3000, force=True)
            for secret in (name, f"{name}-ppk"):
                with contextlib.suppress(GatewayRejected):
                    g.unload_shared(secret)
            with contextlib.suppress(GatewayRejected):
                g.unload_conn(name)


def _size(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.seek(0, 2)
    except OSError:
        return 0


async def test_a_policy_edit_raising_the_minimum_moves_the_tunnel_onto_a_ppk(client: httpx.AsyncClient,
                                                                               lab: Lab) -> None:
    policy = {"name": "pq-office", "min_levels": LEVELS}
    r = await client.post("/v1/policies", json=policy)
    assert r.status_code == 201, r.text
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "policy": "pq-office"})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["suite"]["post_quantum"] is None
    assert all("PPK" not in ike_line(s) for s in swanctl_sas(lab, tunnel["conn"]).values())
    revision = (await client.get("/v1/policies/pq-office")).headers["ETag"]
    raised = {**policy, "min_levels": {**LEVELS, "post_quantum": 5}}

    preview = await client.put("/v1/policies/pq-office", params={"dry_run": "true"}, json=raised,
                               headers={"If-Match": revision})
    assert preview.status_code == 200, preview.text
    (impact,) = [i for i in preview.json()["impact"] if i["tunnel"] == tunnel["id"]]
    assert impact["kind"] == "noncompliant", impact
    assert impact["new"]["suite"]["post_quantum"] == "ppk"
    assert (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()["suite"]["post_quantum"] is None

    edited = await client.put("/v1/policies/pq-office", json=raised, headers={"If-Match": revision})
    assert edited.status_code == 200, edited.text
    deadline = time.monotonic() + 20
    moved = tunnel
    while time.monotonic() < deadline:
        moved = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
        if moved["suite"]["post_quantum"] == "ppk":
            break
        await asyncio.sleep(0.2)
    assert moved["suite"]["post_quantum"] == "ppk", moved
    assert moved["state"] == "up"
    assert moved["levels"]["post_quantum"] == 9
    rekeyer = client.qoss_app.state.runtime.rekeyer  # type: ignore[attr-defined]
    assert await asyncio.to_thread(rekeyer.idle, 15)  # the old IKE_SA closed
    for host, shown in swanctl_sas(lab, tunnel["conn"]).items():
        assert ike_line(shown).rstrip().endswith("/PPK"), (host, shown)
    for host in lab.hosts:
        sas = [s for s in ViciGateway(host.vici_socket, 5.0).list_sas() if s.name == tunnel["conn"]]
        assert len(sas) == 1, (host.name, sas)
        assert sas[0].ppk, host.name
    assert ping(lab).returncode == 0
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)


async def test_reconcile_keeps_a_healthy_tunnels_ppk_and_gives_a_restarted_charon_a_new_one(
        client: httpx.AsyncClient, lab: Lab, calls: Calls) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "min_levels": {**LEVELS, "post_quantum": 5}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert report["healthy"] == [tunnel["id"]]
    assert report["orphans_removed"] == []  # its PPK is the tunnel's, not an orphan
    for host in lab.hosts:
        assert f"{tunnel['conn']}-ppk" in ViciGateway(host.vici_socket, 5.0).get_shared(), host.name
    first = {s for s in calls.secrets if len(s) == 32}
    lab.stop_charon("right")
    lab.start_charon("right")
    # The restarted charon knows nothing: reconcile restores the tunnel with a fresh PSK and PPK.
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert report["restored"] == [tunnel["id"]]
    assert {s for s in calls.secrets if len(s) == 32} - first  # new keys were loaded
    for host, shown in swanctl_sas(lab, tunnel["conn"]).items():
        assert ike_line(shown).rstrip().endswith("/PPK"), (host, shown)
    assert ping(lab).returncode == 0
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)
