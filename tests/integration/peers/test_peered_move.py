"""A peered tunnel below one side's minimums after that side's edit moves make-before-break with
the other side's agreement, whichever side made the edit; a move the other side cannot agree to
leaves the tunnel running as it was. Two ``qoss serve`` on loopback, each driving its own real
charon in the lab's namespaces (the sites of ``tests/integration/tunnels/test_peered.py``)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.lab.network import IKE_INTERFACE
from tests.fixtures.flows import End, flows, lost_only_at_the_switch
from tests.integration.tunnels.test_peered import _ALL_BUT_AES128GCM16, Site, sites

__all__ = ["sites", "until_both"]

#: aes128gcm16 is the cheapest suite meeting these minimums in the shipped standards-2026 table.
_ASK = {"min_levels": {"confidentiality": 8, "integrity": 8}}


def _children(site: Site, conn: str) -> list[tuple[str, str]]:
    """The CHILD_SAs of ``conn`` on the site's charon, as ``swanctl --list-sas`` prints them (state, algorithms)."""
    out = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site.host.vici_socket}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return re.findall(r"(INSTALLED|REKEYING|REKEYED|DELETING|CREATED), TUNNEL[^,]*, (\S+)", out)


@contextlib.contextmanager
def _weakened(site: Site, keyword: str) -> Iterator[None]:
    """The site's own standards-2026 table rates ``keyword``'s confidentiality 4 (below 8); put back after."""
    with site.client() as c:
        table = c.get("/v1/rating-tables/standards-2026").json()
        before = next(r for r in table["ratings"] if r["algorithm"] == keyword)["confidentiality"]
        r = c.patch(f"/v1/rating-tables/standards-2026/ratings/{keyword}",
                    headers={"If-Match": f'"{table["revision"]}"'},
                    json={"confidentiality": 4, "reason": "this site's own judgement"})
        assert r.status_code == 200, r.text
    try:
        yield
    finally:
        with site.client() as c:
            revision = c.get("/v1/rating-tables/standards-2026").json()["revision"]
            c.patch(f"/v1/rating-tables/standards-2026/ratings/{keyword}", headers={"If-Match": f'"{revision}"'},
                    json={"confidentiality": before, "reason": "put back"})


@contextlib.contextmanager
def _ping(a: Site, b: Site, count: int) -> Iterator[subprocess.Popen[str]]:
    """A ping from A's inside address to B's every 50 ms, ``count`` times, counted only if a tunnel
    carried it (B drops clear-text ICMP from the lab network meanwhile)."""
    drop = ["INPUT", "-i", IKE_INTERFACE, "-p", "icmp", "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", b.host.netns, "iptables", "-A", *drop], check=True, timeout=30)
    ping = subprocess.Popen(["ip", "netns", "exec", a.host.netns, "ping", "-i", "0.05", "-c", str(count), "-W", "1",
                             "-I", a.host.inside_address, b.host.inside_address],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield ping
    finally:
        if ping.poll() is None:
            ping.kill()
            ping.wait(10)
        subprocess.run(["ip", "netns", "exec", b.host.netns, "iptables", "-D", *drop], check=True, timeout=30)


def _record(site: Site, tunnel_id: str) -> dict[str, Any]:
    with site.client() as c:
        r = c.get(f"/v1/tunnels/{tunnel_id}")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def until_both(a: Site, b: Site, tunnel: dict[str, Any], within: float,
               look: Callable[[dict[str, Any], dict[str, Any]], tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    """Wait (at most ``within`` seconds, looking every 100 ms) until ``look``, given the tunnel's
    record at A and at B, says it is done; what it saw then (and in the failure when time runs out)."""
    deadline = time.monotonic() + within
    while True:
        seen, done = look(_record(a, tunnel["id"]), _record(b, tunnel["id"]))
        if done:
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)


def _moved_everywhere(a: Site, b: Site, tunnel: dict[str, Any], old: str, within: float) -> dict[str, Any]:
    """Wait (at most ``within`` seconds) until both sides record another ESP proposal than ``old``, the
    same on both, and each charon shows one CHILD_SA of the tunnel, INSTALLED, not on the old suite."""
    def look(on_a: dict[str, Any], on_b: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        children = {"a": _children(a, tunnel["conn"]), "b": _children(b, tunnel["conn"])}
        esp = on_a["proposals"]["esp"]
        return {"a": on_a["proposals"], "b": on_b["proposals"], "children": children}, (
            esp != old and on_b["proposals"]["esp"] == esp and on_a["state"] == on_b["state"] == "up"
            and all(len(c) == 1 and c[0][0] == "INSTALLED" and "AES_GCM_16-128" not in c[0][1]
                    for c in children.values()))
    return until_both(a, b, tunnel, within, look)


# Within 10 s: held with the machine to itself (the local move's test likewise).
@pytest.mark.alone
def test_an_edit_of_bs_table_moves_the_tunnel_on_both_charons_make_before_break(
        sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", **_ASK})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    old = tunnel["proposals"]["esp"]
    assert old.startswith("aes128gcm16"), tunnel["proposals"]
    try:
        with flows(End(a.host.netns, a.host.inside_address), End(b.host.netns, b.host.inside_address),
                   count=200) as lost:
            time.sleep(1.0)  # the flows run through the old SA first
            started = time.monotonic()
            with _weakened(b, "aes128gcm16"):
                seen = _moved_everywhere(a, b, tunnel, old, within=10)
                took = time.monotonic() - started
                done = time.monotonic()
        assert lost_only_at_the_switch(lost, (started, done)) is None, lost
        assert took <= 10, took
        assert seen["a"] == seen["b"]
        on_b = _record(b, tunnel["id"])
        assert on_b["peer"]["role"] == "responder"
        assert "moved from aes128gcm16" in on_b["detail"], on_b
        assert "moving" not in (on_b["provenance"] or {})
    finally:
        with a.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204


def test_an_edit_of_as_table_moves_the_tunnel_too(sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", **_ASK})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    old = tunnel["proposals"]["esp"]
    try:
        with _weakened(a, "aes128gcm16"):
            _moved_everywhere(a, b, tunnel, old, within=10)
        assert "moved from aes128gcm16" in _record(a, tunnel["id"])["detail"]
    finally:
        with a.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204


def test_a_move_the_other_side_cannot_agree_to_leaves_the_tunnel_running_as_it_was(
        sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:  # A accepts nothing but AES-128-GCM-16
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", **_ASK,
                                        "forbids": _ALL_BUT_AES128GCM16})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    before = {"a": _children(a, tunnel["conn"]), "b": _children(b, tunnel["conn"])}
    try:
        with _weakened(b, "aes128gcm16"):
            deadline = time.monotonic() + 10
            on_b = _record(b, tunnel["id"])
            while on_b["state"] != "noncompliant" and time.monotonic() < deadline:
                time.sleep(0.1)
                on_b = _record(b, tunnel["id"])
            assert on_b["state"] == "noncompliant", on_b
            assert "not moved: peer site-a: none of the suites this side offered meets its requirements" in \
                on_b["detail"], on_b
            assert on_b["proposals"] == tunnel["proposals"]
            on_a = _record(a, tunnel["id"])
            assert (on_a["state"], on_a["proposals"]) == ("up", tunnel["proposals"])
            assert {"a": _children(a, tunnel["conn"]), "b": _children(b, tunnel["conn"])} == before
            assert "moving" not in (on_a["provenance"] or {})
            with _ping(a, b, 5) as ping:
                out, _ = ping.communicate(timeout=30)
            assert " 0% packet loss" in out, out
    finally:
        with a.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
