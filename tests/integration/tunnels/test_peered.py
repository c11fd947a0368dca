"""Two qoss services, each driving its own charon, negotiate tunnels as peers.

A real lab (two charons in network namespaces), two ``qoss serve`` processes on loopback with a
database, rating tables and policies each: site A drives the left charon, site B the right one,
and each is registered as the other's peer as an administrator would (identities read from each
side's API). Site A is asked for a tunnel to ``gw-b@site-b``; each charon is checked against its
own VICI socket. The two sites registered each other without ML-KEM-768 keys: a tunnel between
them with a post-quantum minimum is refused before anything is sent or loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import vici

from app.bootstrap import prepare_database
from app.lab.hosts import Lab, LabHost
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.served import serving
from tests.integration.charon.conftest import temporary_lab

QOSS = Path(sys.executable).parent / "qoss"


@dataclass
class Site:
    name: str
    base: str
    token: str
    host: LabHost
    gateway: str
    proc: Any
    db: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


def _site(stack: Any, lab: Lab, where: Path, name: str, host: LabHost, gateway: str) -> Site:
    url = _prepare(where)
    return _register(_serve(stack, lab, url, name), url, name, host, gateway)


def _two_sites(stack: Any, lab: Lab, where: Path) -> tuple[Site, Site]:
    """Site A (``gw-a`` on the lab's left host) and site B (``gw-b`` on its right one), their two
    ``qoss serve`` processes starting side by side; each stops when ``stack`` closes."""
    urls = [_prepare(where / "a"), _prepare(where / "b")]  # one at a time: migrations are not run in threads
    own = [stack.enter_context(contextlib.ExitStack()) for _ in urls]
    with ThreadPoolExecutor(2) as pool:
        served = [pool.submit(_serve, own[i], lab, urls[i], name) for i, name in enumerate(("site-a", "site-b"))]
        a, b = (future.result() for future in served)
    return (_register(a, urls[0], "site-a", lab.host("left"), "gw-a"),
            _register(b, urls[1], "site-b", lab.host("right"), "gw-b"))


def _prepare(where: Path) -> str:
    """A migrated SQLite database in ``where`` (made here); its URL."""
    where.mkdir()
    url = f"sqlite:///{where / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    return url


def _serve(stack: Any, lab: Lab, url: str, name: str, port: int | None = None) -> tuple[str, Any]:
    """``qoss serve`` as peer ``name`` on ``url``'s database, in the database's folder (on ``port``,
    else a free one); its base URL and process."""
    where = Path(url.removeprefix("sqlite:///")).parent
    env = {**os.environ, "QOSS_PEER_NAME": name, "QOSS_STATE_DIR": str(where / "state"),
           "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_VICI_SOCKET_DIRS": json.dumps([str(lab.state_dir)]), "QOSS_PEER_TIMEOUT": "3",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    served: tuple[str, Any] = stack.enter_context(serving([str(QOSS), "serve", "--database-url", url], env=env,
                                                          log=where / "serve.log", cwd=where, port=port))
    return served


def _register(served: tuple[str, Any], url: str, name: str, host: LabHost, gateway: str) -> Site:
    """The served site (on ``url``'s database) with an administrator's token and its gateway on ``host``."""
    base, proc = served
    token = make_token(url, f"{name}-admin", ["admin"])  # once the server has made its audit key
    site = Site(name, base, token, host, gateway, proc, url)
    with site.client() as c:
        r = c.post("/v1/gateways", json={"name": gateway, "vici_socket": host.vici_socket,
                                          "ike_address": host.ike_address,
                                          "inside_networks": [f"{host.inside_address}/32"]})
        assert r.status_code == 201, r.text
    return site


def _peer(site: Site, other: Site, *, min_levels: dict[str, int] | None = None) -> None:
    with other.client() as c:
        identity = c.get("/v1/peering/identity").json()
    assert identity["name"] == other.name
    with site.client() as c:
        r = c.post("/v1/peers", json={
            "name": other.name, "url": other.base, "sign_public_key": identity["sign_public_key"],
            "kem_public_key": identity["kem_public_key"], "gateways": [site.gateway],
            "networks": [f"{site.host.inside_address}/32"], "min_levels": min_levels or {"confidentiality": 1}})
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, Site]]:
    where = tmp_path_factory.mktemp("peered")
    with temporary_lab("pe") as lab, contextlib.ExitStack() as stack:
        a, b = _two_sites(stack, lab, where)
        _peer(a, b)
        _peer(b, a)
        yield a, b


def _sas(site: Site) -> list[dict[str, Any]]:
    with _session(site) as session:
        return [sa for item in session.list_sas() for sa in item.values()]


def _conns(site: Site) -> list[str]:
    with _session(site) as session:
        return [name for item in session.list_conns() for name in item]


@contextlib.contextmanager
def _session(site: Site) -> Iterator[Any]:
    """A VICI session on the site's own charon socket."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(site.host.vici_socket)
        yield vici.Session(sock)
    finally:
        sock.close()


def _ping(a: Site, b: Site) -> bool:
    done = subprocess.run(["ip", "netns", "exec", a.host.netns, "ping", "-c", "1", "-W", "2", "-I",
                           a.host.inside_address, b.host.inside_address], capture_output=True, timeout=10)
    return done.returncode == 0


def _child(sa: dict[str, Any]) -> dict[str, Any]:
    children = sa.get("child-sas") or sa.get(b"child-sas") or {}
    assert len(children) == 1, sa
    child: dict[str, Any] = next(iter(children.values()))
    return child


def test_a_tunnel_asked_at_a_for_bs_gateway_comes_up_with_one_suite_on_both_charons(sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b",
                                        "min_levels": {"confidentiality": 5, "integrity": 5}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["state"] == "up"
    assert tunnel["peer"]["site"] == "site-b"
    assert tunnel["peer"]["role"] == "initiator"
    on_a, on_b = _sas(a), _sas(b)
    assert len(on_a) == 1
    assert len(on_b) == 1
    child_a, child_b = _child(on_a[0]), _child(on_b[0])
    assert child_a["state"] == child_b["state"] == b"INSTALLED"
    for key in ("encr-alg", "encr-keysize", "integ-alg"):
        assert child_a.get(key) == child_b.get(key)
    assert _ping(a, b)
    with b.client() as c:
        listed = c.get("/v1/tunnels").json()
    assert [(t["id"], t["state"], t["peer"]["site"], t["peer"]["role"]) for t in listed] == [
        (tunnel["id"], "up", "site-a", "responder")]
    with a.client() as c:
        assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
    assert _sas(a) == []
    assert _sas(b) == []
    assert _conns(a) == []
    assert _conns(b) == []
    with b.client() as c:
        assert c.get("/v1/tunnels").json() == []



def test_a_post_quantum_minimum_with_a_peer_without_an_mlkem_key_is_refused(sites: tuple[Site, Site]) -> None:
    """A peer registered without an ML-KEM-768 key gets no post-quantum preshared key: a tunnel
    with it and a post-quantum minimum is refused before anything is sent or loaded, saying why."""
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b",
                                        "min_levels": {"confidentiality": 5, "post_quantum": 5}})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "UnsupportedProtection"
        assert "site-b registered no ML-KEM-768 key" in r.json()["detail"]
        assert c.get("/v1/tunnels").json() == []
    with b.client() as c:
        assert c.get("/v1/tunnels").json() == []
    assert _sas(a) == _sas(b) == []
    assert _conns(a) == _conns(b) == []

#: Every confidentiality algorithm of the shipped tables but AES-128-GCM-16.
_ALL_BUT_AES128GCM16 = [
    "aes128", "aes192", "aes256", "aes128ctr", "aes192ctr", "aes256ctr", "camellia128", "camellia192", "camellia256",
    "camellia128ctr", "camellia192ctr", "camellia256ctr", "3des", "cast128", "blowfish128", "blowfish192",
    "blowfish256", "des", "null", "aes128gcm12", "aes128gcm8", "aes192gcm16", "aes192gcm12", "aes192gcm8",
    "aes256gcm16", "aes256gcm12", "aes256gcm8", "chacha20poly1305", "aes128ccm16", "aes128ccm12", "aes128ccm8",
    "aes192ccm16", "aes192ccm12", "aes192ccm8", "aes256ccm16", "aes256ccm12", "aes256ccm8"]


def test_with_tables_that_differ_both_sides_pick_a_suite_b_accepts_and_a_refusal_tells_nothing(
        sites: tuple[Site, Site]) -> None:
    a, b = sites
    ask = {"min_levels": {"confidentiality": 8, "integrity": 8}}
    alone = httpx.post(f"{a.base}/v1/negotiations", json={"peers": [{"name": "app", **ask}]}).json()
    assert alone["proposals"]["esp"].startswith("aes128gcm16")  # what A alone would pick
    with b.client() as c:  # B's own table: AES-128-GCM is no longer confidentiality 8 there
        table = c.get("/v1/rating-tables/standards-2026").json()
        r = c.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16",
                    headers={"If-Match": f'"{table["revision"]}"'},
                    json={"confidentiality": 4, "reason": "this site's own judgement"})
        assert r.status_code == 200, r.text
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", **ask})
        assert r.status_code == 201, r.text
        tunnel = r.json()
        assert not tunnel["proposals"]["esp"].startswith("aes128gcm16")
        assert tunnel["levels"]["confidentiality"] >= 8
        on_b = httpx.get(f"{b.base}/v1/tunnels/{tunnel['id']}", headers={"Authorization": f"Bearer {b.token}"})
        assert on_b.json()["proposals"]["esp"] == tunnel["proposals"]["esp"]
        assert _ping(a, b)
        assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
        # Only AES-128-GCM-16 offered: nothing B accepts. Refused, nothing loaded, and the refusal
        # carries none of B's numbers.
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b", **ask,
                                        "forbids": _ALL_BUT_AES128GCM16})
    assert r.status_code == 409, r.text
    assert r.json() == {"error": "PeerNoFeasibleSuite",
                        "detail": "peer site-b: none of the suites this side offered meets its requirements"}
    assert _conns(a) == []
    assert _conns(b) == []
    with b.client() as c:
        assert c.get("/v1/tunnels").json() == []


def test_the_cli_reads_the_identity_and_lists_the_peers_through_the_service(sites: tuple[Site, Site]) -> None:
    a, _ = sites
    env = {**os.environ, "QOSS_URL": a.base, "QOSS_TOKEN": a.token}
    for command, check in ((["identity"], lambda doc: doc["name"] == "site-a"),
                           (["list"], lambda doc: [p["name"] for p in doc] == ["site-b"])):
        done = subprocess.run([str(QOSS), "peers", *command, "--output", "json"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert check(json.loads(done.stdout)), done.stdout


def test_with_bs_qoss_down_a_new_request_names_the_peer_and_loads_nothing(sites: tuple[Site, Site],
                                                                           tmp_path: Path) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/peers", json={
            "name": "site-gone", "url": "http://127.0.0.1:9", "sign_public_key": "A" * 43,
            "kem_public_key": "A" * 43, "gateways": ["gw-a"], "networks": ["10.0.0.0/8"]})
        assert r.status_code in (201, 422), r.text
        if r.status_code == 422:  # not a valid key: use B's keys under another name
            identity = httpx.get(f"{b.base}/v1/peering/identity", headers={"Authorization": f"Bearer {b.token}"}).json()
            r = c.post("/v1/peers", json={
                "name": "site-gone", "url": "http://127.0.0.1:9", "sign_public_key": identity["sign_public_key"],
                "kem_public_key": identity["kem_public_key"], "gateways": ["gw-a"], "networks": ["10.0.0.0/8"]})
            assert r.status_code == 201, r.text
        started = time.monotonic()
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-gone"})
    assert time.monotonic() - started < 15
    assert r.status_code in (503, 504), r.text
    assert "site-gone" in r.json()["detail"]
    assert _conns(a) == []


def test_revoking_the_peering_at_b_ends_the_tunnel_on_both_sides(sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b"})
        assert r.status_code == 201, r.text
    assert len(_sas(a)) == 1
    with b.client() as c:
        r = c.patch("/v1/peers/site-a", json={"state": "revoked"})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "revoked"
    assert _sas(a) == []
    assert _sas(b) == []
    assert _conns(a) == []
    assert _conns(b) == []
    with a.client() as c:
        assert c.get("/v1/tunnels").json() == []
        refused = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b"})
    assert refused.status_code == 502, refused.text
    assert "site-b" in refused.json()["detail"]
    assert _conns(a) == []
