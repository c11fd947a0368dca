"""``qoss lab up --peers``: two sites, each its own namespace, charon and ``qoss serve``, reached
from the root namespace through their relays; ``qoss lab down`` leaves nothing, also after an
``up`` killed half-way."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from typer.testing import CliRunner

from app.cli.main import app as cli_app
from app.lab.peers import SITES, PeersLab, PeersLabError
from app.lab.processes import running
from tests.integration.peers.conftest import PeersCli, peers_cli

pytestmark = pytest.mark.charon

FIELDS = {"url", "token", "gateway", "inside", "netns", "vici", "pid", "lab_url"}


def admin(site: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {site['token']}"}


def test_lab_up_peers_prints_one_json_line_naming_every_part_of_both_sites(
        peers_cli_up: tuple[PeersCli, subprocess.CompletedProcess[str]], peers_lab: dict[str, Any]) -> None:
    cli, up = peers_cli_up
    assert len(up.stdout.strip().splitlines()) == 1, up.stdout
    sites = peers_lab["sites"]
    assert set(sites) == set(SITES)
    for name, site in sites.items():
        assert set(site) == FIELDS, site
        assert site["netns"] == f"{cli.prefix}-{name}"
        assert Path("/run/netns", site["netns"]).exists()
        assert site["gateway"] == name
        assert urlsplit(site["url"]).hostname == "127.0.0.1"
        assert running(site["pid"])
        assert Path(site["vici"]).is_socket()
        assert Path(site["vici"]).is_relative_to(cli.state_dir)
        assert site["token"].startswith("qoss_")
    assert {n: (s["inside"], s["lab_url"]) for n, s in sites.items()} == {
        "site-a": ("10.1.0.1", "http://10.77.0.1:8500"), "site-b": ("10.2.0.1", "http://10.77.0.2:8500")}


def test_each_url_answers_healthz_from_the_root_namespace_which_gains_no_address(peers_lab: dict[str, Any]) -> None:
    for site in peers_lab["sites"].values():
        r = httpx.get(f"{site['url']}/healthz", timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
    root_addresses = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True,
                                    timeout=10).stdout
    assert "10.77.0." not in root_addresses


def test_each_site_serves_in_its_namespace_on_its_lab_address(peers_lab: dict[str, Any]) -> None:
    for site in peers_lab["sites"].values():
        listening = subprocess.run(["ip", "netns", "exec", site["netns"], "ss", "-Htln"], capture_output=True,
                                   text=True, check=True, timeout=10).stdout
        lab = urlsplit(site["lab_url"])
        assert f"{lab.hostname}:{lab.port}" in listening, listening


def test_each_vici_socket_answers(peers_lab: dict[str, Any]) -> None:
    for site in peers_lab["sites"].values():
        done = subprocess.run(["swanctl", "--stats", "--uri", f"unix://{site['vici']}"], capture_output=True,
                              text=True, timeout=15, check=False)
        assert done.returncode == 0, done.stderr
        assert "kernel-libipsec" in done.stdout


def test_each_site_has_its_own_database_token_and_gateway(peers_lab: dict[str, Any]) -> None:
    sites = peers_lab["sites"]
    for name, site in sites.items():
        other = sites[next(n for n in SITES if n != name)]
        r = httpx.get(f"{site['url']}/v1/gateways", headers=admin(site), timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        assert [(g["name"], g["ike_address"], g["inside_networks"], g["vici_socket"]) for g in r.json()] == [
            (name, urlsplit(site["lab_url"]).hostname, [f"{site['inside']}/32"], site["vici"])]
        refused = httpx.get(f"{site['url']}/v1/gateways", headers=admin(other), timeout=10, trust_env=False)
        assert refused.status_code == 401, refused.text


def test_each_site_lists_the_other_as_its_peer_once(peers_lab: dict[str, Any]) -> None:
    sites = peers_lab["sites"]
    for name, site in sites.items():
        other_name = next(n for n in SITES if n != name)
        other = sites[other_name]
        identity = httpx.get(f"{other['url']}/v1/peering/identity", headers=admin(other), timeout=10,
                             trust_env=False)
        assert identity.status_code == 200, identity.text
        r = httpx.get(f"{site['url']}/v1/peers", headers=admin(site), timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        assert [(p["name"], p["url"], p["sign_public_key"], p["kem_public_key"], p.get("mlkem_public_key"),
                 p["gateways"], p["networks"], p["min_levels"], p["state"]) for p in r.json()] == [
            (other_name, other["lab_url"], identity.json()["sign_public_key"], identity.json()["kem_public_key"],
             identity.json()["mlkem_public_key"], [site["gateway"]], [f"{site['inside']}/32"],
             {"confidentiality": 1, "integrity": 1, "key_exchange": 1, "post_quantum": 0}, "active")]


def test_the_sites_reach_each_other_over_the_lab_network(peers_lab: dict[str, Any]) -> None:
    for name, site in peers_lab["sites"].items():
        other = peers_lab["sites"][next(n for n in SITES if n != name)]
        done = subprocess.run(["ip", "netns", "exec", site["netns"], "curl", "-sS", "-o", "/dev/null", "-w",
                               "%{http_code}", "--max-time", "10", f"{other['lab_url']}/healthz"],
                              capture_output=True, text=True, timeout=20, check=False)
        assert done.stdout == "200", done.stderr


def _requests_on_one_connection(url: str, count: int) -> list[bytes]:
    """``count`` requests for /healthz sent together on one connection (keep-alive, pipelined); each
    answer's status line."""
    parts = urlsplit(url)
    request = f"GET /healthz HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    statuses = []
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(request * count)
        reader = conn.makefile("rb")
        for _ in range(count):
            statuses.append(reader.readline().strip())
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reader.read(length)
    return statuses


def test_a_relay_carries_keep_alive_and_many_connections_at_once(peers_lab: dict[str, Any]) -> None:
    url = peers_lab["sites"]["site-a"]["url"]
    assert _requests_on_one_connection(url, 5) == [b"HTTP/1.1 200 OK"] * 5
    with ThreadPoolExecutor(max_workers=80) as pool:
        answers = list(pool.map(lambda _: _requests_on_one_connection(url, 3), range(160)))
    assert answers == [[b"HTTP/1.1 200 OK"] * 3] * 160


def test_lab_down_after_an_up_killed_half_way_leaves_nothing() -> None:
    """The ``up`` is killed once a site's service runs (its children live on in their own
    sessions); ``lab down`` from another process finds and removes them all the same."""
    cli = peers_cli("pk")
    try:
        up = cli.start("up", "--peers", "--prefix", cli.prefix)
        record = cli.state_dir / "peers.json"
        deadline = time.monotonic() + 90
        started = False
        while not started and up.poll() is None and time.monotonic() < deadline:
            try:
                started = "pid" in json.loads(record.read_text()).get("sites", {}).get("site-a", {})
            except (OSError, ValueError):
                started = False
            time.sleep(0.05)
        up.send_signal(signal.SIGKILL)
        _, err = up.communicate(timeout=30)
        assert started, err
        assert cli.leftovers(), "the killed up left nothing to take down"
        down = cli.run("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert cli.leftovers() == []
    finally:
        cli.down()
        shutil.rmtree(cli.root, ignore_errors=True)


@pytest.mark.parametrize("extra", [["--agent"], ["--family", "6"], ["--family", "4,6"], ["--hosts", "3"]],
                         ids=["agent", "family-6", "family-4-6", "hosts-3"])
def test_lab_up_peers_refuses_what_it_cannot_build_and_builds_nothing(extra: list[str]) -> None:
    cli = peers_cli("pr")
    try:
        done = CliRunner().invoke(cli_app, ["lab", "up", "--peers", *extra, "--prefix", cli.prefix],
                                  env={"QOSS_LAB_DIR": str(cli.lab_dir)})
        assert done.exit_code == 2, done.output
        assert "--peers builds its own two IPv4 sites" in done.output
        assert cli.leftovers() == []
        assert not cli.lab_dir.exists()
    finally:
        shutil.rmtree(cli.root, ignore_errors=True)


def test_a_second_lab_up_peers_is_refused_and_the_first_runs_on(
        peers_cli_up: tuple[PeersCli, subprocess.CompletedProcess[str]], peers_lab: dict[str, Any]) -> None:
    cli, _ = peers_cli_up
    again = cli.up()
    assert again.returncode == 1
    assert "take it down first" in again.stderr
    assert again.stdout == ""
    for site in peers_lab["sites"].values():
        assert httpx.get(f"{site['url']}/healthz", timeout=10, trust_env=False).status_code == 200
        assert running(site["pid"])


def test_a_site_whose_service_cannot_start_fails_the_up_with_its_log_and_leaves_nothing() -> None:
    cli = peers_cli("pf")
    lab = PeersLab(cli.state_dir, prefix=cli.prefix, server_env={"QOSS_MAX_CONNECTIONS_PER_SOURCE": "-1"},
                   startup_timeout=30)
    try:
        with pytest.raises(PeersLabError) as raised:
            lab.up()
        assert "serve process exited with" in str(raised.value)
        assert "QOSS_MAX_CONNECTIONS_PER_SOURCE" in str(raised.value)  # the service's own words, from its log
        assert cli.leftovers() == []
    finally:
        lab.down()
        shutil.rmtree(cli.root, ignore_errors=True)
