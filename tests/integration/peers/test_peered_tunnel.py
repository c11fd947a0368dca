"""A tunnel across the peers lab: asked at site A for site B's gateway, it comes up with one suite
installed on both charons (each read with swanctl on its own socket), a ping between the inside
networks crosses it, site B lists it with its peer, and a delete at A clears both charons."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import httpx


def _swanctl(site: dict[str, Any], *args: str) -> str:
    done = subprocess.run(["swanctl", *args, "--uri", f"unix://{site['vici']}"], capture_output=True, text=True,
                          timeout=20, check=True)
    return done.stdout


def _api(site: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=site["url"], headers={"Authorization": f"Bearer {site['token']}"}, timeout=30)


def test_a_tunnel_asked_at_a_comes_up_on_both_charons_and_carries_a_ping(peers_lab: dict[str, Any]) -> None:
    a, b = peers_lab["sites"]["site-a"], peers_lab["sites"]["site-b"]
    with _api(a) as c:
        r = c.post("/v1/tunnels", json={"initiator": a["gateway"], "responder": f"{b['gateway']}@site-b",
                                        "min_levels": {"confidentiality": 8, "integrity": 8}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    conn = tunnel["conn"]
    on_a, on_b = _swanctl(a, "--list-sas"), _swanctl(b, "--list-sas")
    for listing in (on_a, on_b):
        assert f"{conn}: #" in listing, listing
        assert re.search(rf"{conn}: #\d+, reqid \d+, INSTALLED, TUNNEL", listing), listing
    suite = re.compile(r"INSTALLED, TUNNEL[^\n]*\n\s+(\S+)")
    assert suite.search(on_a) is not None
    assert suite.search(on_a)[1] == suite.search(on_b)[1]  # type: ignore[index]
    ping = subprocess.run(["ip", "netns", "exec", a["netns"], "ping", "-c", "2", "-W", "2", "-I", a["inside"],
                           b["inside"]], capture_output=True, text=True, timeout=20)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    with _api(b) as c:
        listed = [t for t in c.get("/v1/tunnels").json() if t["id"] == tunnel["id"]]
    assert len(listed) == 1
    assert listed[0]["state"] == "up"
    assert listed[0]["peer"]["site"] == "site-a"
    assert listed[0]["peer"]["role"] == "responder"
    with _api(a) as c:
        assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    assert conn not in _swanctl(a, "--list-sas")
    assert conn not in _swanctl(b, "--list-sas")
    assert conn not in _swanctl(a, "--list-conns")
    assert conn not in _swanctl(b, "--list-conns")
