"""A tunnel with another qoss and a post-quantum minimum, between real processes in the peers lab
(each site registered the other with its ML-KEM-768 key): the responder makes the PPK, loads it and
sends it in its answer sealed hybrid; both charons show the IKE SA with ``/PPK`` and a ping crosses.
Without the minimum, neither end has a PPK."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx

from app.adapters.vici.gateway import ViciGateway


def _api(site: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=site["url"], headers={"Authorization": f"Bearer {site['token']}"}, timeout=30,
                        trust_env=False)


def _ike_line(site: dict[str, Any], conn: str) -> str:
    shown = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site['vici']}"],
                           capture_output=True, text=True, timeout=20, check=True).stdout
    return next(line for line in shown.splitlines() if "/PRF_" in line and "INSTALLED" not in line)


def _ping(a: dict[str, Any], b: dict[str, Any]) -> bool:
    done = subprocess.run(["ip", "netns", "exec", a["netns"], "ping", "-c", "2", "-W", "2", "-I", a["inside"],
                           b["inside"]], capture_output=True, timeout=20, check=False)
    return done.returncode == 0


def test_a_post_quantum_minimum_gets_a_ppk_on_both_charons(peers_lab: dict[str, Any]) -> None:
    a, b = peers_lab["sites"]["site-a"], peers_lab["sites"]["site-b"]
    with _api(a) as c:
        r = c.post("/v1/tunnels", json={"initiator": a["gateway"], "responder": f"{b['gateway']}@site-b",
                                        "min_levels": {"confidentiality": 5, "post_quantum": 5}})
        assert r.status_code == 201, r.text
        tunnel = r.json()
        try:
            assert tunnel["suite"]["post_quantum"] == "ppk"
            assert tunnel["levels"]["post_quantum"] == 9
            for site in (a, b):
                assert _ike_line(site, tunnel["conn"]).rstrip().endswith("/PPK"), site["gateway"]
                assert f"{tunnel['conn']}-ppk" in ViciGateway(site["vici"], 5.0).get_shared()
            with _api(b) as cb:
                on_b = cb.get(f"/v1/tunnels/{tunnel['id']}").json()
            assert on_b["suite"]["post_quantum"] == "ppk"
            assert on_b["live"]["ppk"] is True
            assert _ping(a, b)
        finally:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    for site in (a, b):
        assert f"{tunnel['conn']}-ppk" not in ViciGateway(site["vici"], 5.0).get_shared(), site["gateway"]


def test_without_the_minimum_neither_end_has_a_ppk(peers_lab: dict[str, Any]) -> None:
    a, b = peers_lab["sites"]["site-a"], peers_lab["sites"]["site-b"]
    with _api(a) as c:
        r = c.post("/v1/tunnels", json={"initiator": a["gateway"], "responder": f"{b['gateway']}@site-b",
                                        "min_levels": {"confidentiality": 5}})
        assert r.status_code == 201, r.text
        tunnel = r.json()
        try:
            assert tunnel["suite"]["post_quantum"] is None
            for site in (a, b):
                assert "PPK" not in _ike_line(site, tunnel["conn"]), site["gateway"]
                assert ViciGateway(site["vici"], 5.0).get_shared() == [tunnel["conn"]]
        finally:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
