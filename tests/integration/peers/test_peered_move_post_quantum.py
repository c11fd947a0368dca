"""A running peered tunnel moves onto a post-quantum preshared key: site B's policy edit raises its
``post_quantum`` minimum, B's move asks for a PPK, site A makes a new one for the new SA and sends it
sealed hybrid, and both charons run the tunnel on a new IKE SA with ``/PPK`` while datagrams
every 50 ms cross both ways, none lost but at the switch (``tests/fixtures/flows.py``). Two
``qoss serve`` on loopback, each driving its own real charon in the lab's namespaces, each
registered as the other's peer with its ML-KEM-768 key."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.adapters.vici.gateway import ViciGateway
from tests.fixtures.flows import End, flows, lost_only_at_the_switch
from tests.integration.charon.conftest import temporary_lab
from tests.integration.peers.test_peered_move import _record, _weakened, until_both
from tests.integration.tunnels.test_peered import Site, _two_sites

_POLICY = {"name": "pq-branch", "min_levels": {"confidentiality": 8, "integrity": 8}}


def _peer(site: Site, other: Site) -> None:
    """Register ``other`` at ``site`` with all three of its public keys (the ML-KEM-768 one too)."""
    with other.client() as c:
        identity = c.get("/v1/peering/identity").json()
    assert identity.get("mlkem_public_key"), identity
    with site.client() as c:
        r = c.post("/v1/peers", json={
            "name": other.name, "url": other.base, "sign_public_key": identity["sign_public_key"],
            "kem_public_key": identity["kem_public_key"], "mlkem_public_key": identity["mlkem_public_key"],
            "gateways": [site.gateway], "networks": [f"{site.host.inside_address}/32"],
            "min_levels": {"confidentiality": 1}})
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, Site]]:
    where = tmp_path_factory.mktemp("peered-pq")
    with temporary_lab("pq") as lab, contextlib.ExitStack() as stack:
        a, b = _two_sites(stack, lab, where)
        _peer(a, b)
        _peer(b, a)
        yield a, b


def _ike_lines(site: Site, conn: str) -> list[str]:
    """The IKE SAs of ``conn`` on the site's charon as ``swanctl --list-sas`` prints their algorithms."""
    out = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site.host.vici_socket}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return [line.strip() for line in out.splitlines() if "/PRF_" in line and "INSTALLED" not in line]


def _children(site: Site, conn: str) -> list[str]:
    out = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site.host.vici_socket}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return re.findall(r"(INSTALLED|REKEYING|REKEYED|DELETING|CREATED), TUNNEL", out)


def _on_ppk_everywhere(a: Site, b: Site, tunnel: dict[str, Any], within: float) -> dict[str, Any]:
    """Wait (at most ``within`` seconds) until both sides record the tunnel up with a PPK and each
    charon shows one IKE SA of it, with ``/PPK``, carrying one INSTALLED CHILD_SA."""
    def look(on_a: dict[str, Any], on_b: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        seen = {"a": (on_a["state"], on_a["suite"]), "b": (on_b["state"], on_b["suite"]),
                "ikes": {s.name: _ike_lines(s, tunnel["conn"]) for s in (a, b)},
                "children": {s.name: _children(s, tunnel["conn"]) for s in (a, b)}}
        return seen, (on_a["state"] == on_b["state"] == "up" and on_a["suite"]["post_quantum"] == "ppk"
                      and on_b["suite"]["post_quantum"] == "ppk"
                      and all(len(lines) == 1 and lines[0].endswith("/PPK") for lines in seen["ikes"].values())
                      and all(c == ["INSTALLED"] for c in seen["children"].values()))
    return until_both(a, b, tunnel, within, look)


# Held with the machine to itself (the other moves' tests likewise).
@pytest.mark.alone
def test_a_policy_edit_at_b_raising_post_quantum_moves_the_tunnel_onto_a_ppk_on_both_charons(
        sites: tuple[Site, Site]) -> None:
    a, b = sites
    with b.client() as c:
        assert c.post("/v1/policies", json=_POLICY).status_code == 201
        r = c.post("/v1/tunnels", json={"initiator": "gw-b", "responder": "gw-a@site-a", "policy": _POLICY["name"]})
        assert r.status_code == 201, r.text
        tunnel = r.json()
        revision = c.get(f"/v1/policies/{_POLICY['name']}").headers["ETag"]
    try:
        assert tunnel["suite"]["post_quantum"] is None
        assert not any(line.endswith("/PPK") for s in (a, b) for line in _ike_lines(s, tunnel["conn"]))
        with flows(End(b.host.netns, b.host.inside_address), End(a.host.netns, a.host.inside_address),
                   count=200) as lost:
            time.sleep(1.0)  # the flows run through the old SA first
            started = time.monotonic()
            with b.client() as c:
                raised = {**_POLICY, "min_levels": {**_POLICY["min_levels"], "post_quantum": 5}}
                r = c.put(f"/v1/policies/{_POLICY['name']}", json=raised, headers={"If-Match": revision})
                assert r.status_code == 200, r.text
            seen = _on_ppk_everywhere(a, b, tunnel, within=15)
            done = time.monotonic()
        assert lost_only_at_the_switch(lost, (started, done)) is None, lost
        on_a, on_b = _record(a, tunnel["id"]), _record(b, tunnel["id"])
        assert on_a["proposals"] == on_b["proposals"], seen
        assert on_b["levels"]["post_quantum"] >= 5
        assert on_a["peer"]["role"] == "responder"
        assert "moved from" in on_a["detail"], on_a
        assert "moving" not in (on_a["provenance"] or {})
        for site in (a, b):  # one key each, the new SA's: the old one was replaced
            charon = ViciGateway(site.host.vici_socket, 5.0)
            shared = {s for s in charon.get_shared() if s.startswith(tunnel["conn"])}
            assert shared == {tunnel["conn"], f"{tunnel['conn']}-ppk"}, site.name
            (sa,) = charon.list_sas(ike=tunnel["conn"])
            assert sa.ppk, site.name
    finally:
        with b.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    for site in (a, b):
        assert f"{tunnel['conn']}-ppk" not in ViciGateway(site.host.vici_socket, 5.0).get_shared(), site.name


def test_a_tunnel_with_a_ppk_moves_onto_a_new_ppk_when_bs_table_edit_leaves_its_suite_short(
        sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", "min_levels": {
            "confidentiality": 8, "integrity": 8, "post_quantum": 5}})
        assert r.status_code == 201, r.text
        tunnel = r.json()
    try:
        old = tunnel["proposals"]["esp"]
        assert old.startswith("aes128gcm16"), tunnel["proposals"]
        keys = {s.name: _record(s, tunnel["id"])["provenance"]["ppk_id"] for s in (a, b)}
        assert keys["site-a"] == keys["site-b"]
        with _weakened(b, "aes128gcm16"):
            until_both(a, b, tunnel, 15, lambda on_a, on_b: (  # both sides' records moved off the old suite
                {"a": on_a, "b": on_b}, old not in (on_a["proposals"]["esp"], on_b["proposals"]["esp"])))
            seen = _on_ppk_everywhere(a, b, tunnel, within=15)
        moved = {s.name: _record(s, tunnel["id"]) for s in (a, b)}
        assert moved["site-a"]["proposals"] == moved["site-b"]["proposals"], seen
        assert moved["site-a"]["provenance"]["ppk_id"] == moved["site-b"]["provenance"]["ppk_id"]
        assert moved["site-a"]["provenance"]["ppk_id"] != keys["site-a"]  # a new key for the new SA
    finally:
        with a.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    for site in (a, b):
        assert f"{tunnel['conn']}-ppk" not in ViciGateway(site.host.vici_socket, 5.0).get_shared(), site.name
