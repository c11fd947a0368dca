"""In the peers lab (``qoss lab up --peers``: each site its own namespace, charon and ``qoss serve``),
an edit of B's own rating table that puts the running suite below B's minimum moves the tunnel on
both charons within 10 s, nothing lost both ways but at the switch: B offers what it accepts now,
A chooses, both charons take the new SA before the old one goes."""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.fixtures.figures import figure
from tests.fixtures.flows import End, flows, lost_only_at_the_switch, told

#: aes128gcm16 is the cheapest suite meeting these minimums in the shipped standards-2026 table.
_ASK = {"min_levels": {"confidentiality": 8, "integrity": 8}}


def _api(site: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=site["url"], headers={"Authorization": f"Bearer {site['token']}"}, timeout=30)


def _children(site: dict[str, Any], conn: str) -> list[tuple[str, str]]:
    """The CHILD_SAs of ``conn`` on the site's own charon, as ``swanctl --list-sas`` prints them (state, algorithms)."""
    out = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site['vici']}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return re.findall(r"(INSTALLED|REKEYING|REKEYED|DELETING|CREATED), TUNNEL[^,]*, (\S+)", out)


# Within 10 s: held with the machine to itself (the local move's test likewise).
@pytest.mark.alone
def test_an_edit_of_bs_own_table_moves_the_tunnel_on_both_charons_within_10_s_make_before_break(
        peers_lab: dict[str, Any]) -> None:
    a, b = peers_lab["sites"]["site-a"], peers_lab["sites"]["site-b"]
    with _api(a) as c:
        r = c.post("/v1/tunnels", json={"initiator": a["gateway"], "responder": f"{b['gateway']}@site-b", **_ASK})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    conn, old = tunnel["conn"], tunnel["proposals"]["esp"]
    assert old.startswith("aes128gcm16"), tunnel["proposals"]
    for site in (a, b):
        assert [state for state, _ in _children(site, conn)] == ["INSTALLED"]
    with flows(End(a["netns"], a["inside"]), End(b["netns"], b["inside"]), count=200) as lost:
        time.sleep(1.0)  # the flows run through the old SA first
        with _api(b) as c:
            table = c.get("/v1/rating-tables/standards-2026").json()
            started = time.monotonic()
            r = c.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16",
                        headers={"If-Match": f'"{table["revision"]}"'},
                        json={"confidentiality": 4, "reason": "site B's own judgement"})
        assert r.status_code == 200, r.text
        seen: dict[str, Any] = {}
        while time.monotonic() - started < 10:
            seen = {"a": _children(a, conn), "b": _children(b, conn)}
            if all(len(c) == 1 and c[0][0] == "INSTALLED" and "AES_GCM_16-128" not in c[0][1] for c in seen.values()):
                break
            time.sleep(0.1)
        took = time.monotonic() - started
        done = time.monotonic()
        assert took < 10, seen
        assert seen["a"] == seen["b"], seen  # one suite, the same on both charons
    assert lost_only_at_the_switch(lost, (started, done)) is None, lost
    figure("peered move in the peers lab", f"B's table edit to both charons on the new suite: {took:.1f} s; "
                                           f"datagrams every 50 ms lost both ways: {told(lost)}")
    with _api(a) as ca, _api(b) as cb:
        on_a, on_b = ca.get(f"/v1/tunnels/{tunnel['id']}").json(), cb.get(f"/v1/tunnels/{tunnel['id']}").json()
        assert on_a["proposals"] == on_b["proposals"]
        assert on_a["proposals"]["esp"] != old
        assert on_a["state"] == on_b["state"] == "up"
        assert "moved from aes128gcm16" in on_b["detail"]
        assert ca.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    assert conn not in subprocess.run(["swanctl", "--list-conns", "--uri", f"unix://{b['vici']}"], capture_output=True,
                                      text=True, timeout=10, check=True).stdout
