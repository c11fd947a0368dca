"""One real lab (two charons with kernel-libipsec in network namespaces) per test module.

The lab is always torn down, also when a test or the set-up fails. When a test fails,
the lines both charons logged during it are printed with the failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.adapters.vici import IkeSa, ViciGateway
from app.domain.errors import GatewayError
from app.lab.hosts import Lab, LabHost
from tests.fixtures.secrets import keep_log

PSK = "lab-psk-" + uuid.uuid4().hex


@dataclass(frozen=True)
class Peer:
    host: LabHost
    gateway: ViciGateway


@dataclass(frozen=True)
class Pair:
    lab: Lab
    left: Peer
    right: Peer


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@contextmanager
def temporary_lab(prefix_hint: str) -> Iterator[Lab]:
    """A two-host lab with a unique prefix, always torn down and its state removed."""
    state = Path(tempfile.mkdtemp(prefix="qoss-lab-", dir="/tmp"))  # short: UNIX socket paths
    lab = Lab(state, prefix=f"{prefix_hint}{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}")
    hosts = []
    try:
        lab.up()
        hosts = lab.hosts
        yield lab
    finally:
        try:
            lab.down()
        finally:
            for host in hosts:  # kept for the suite-wide secret sweep
                keep_log(host.log_path, f"charon-{host.name}.log")
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with temporary_lab("qt") as lab:
        left, right = lab.host("left"), lab.host("right")
        yield Pair(lab, Peer(left, left.gateway(timeout=5.0)), Peer(right, right.gateway(timeout=5.0)))


@pytest.fixture(autouse=True)
def dump_logs_on_failure(request: pytest.FixtureRequest, pair: Pair) -> Iterator[None]:
    hosts = [pair.left.host, pair.right.host]
    offsets = {h.name: _size(h.log_path) for h in hosts}
    yield
    failed = any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False) for when in ("setup", "call")
    )
    if failed:
        for h in hosts:
            with open(h.log_path, errors="replace") as log:
                log.seek(offsets[h.name])
                print(f"\n===== charon log of {h.name} ({h.log_path}) during the test =====\n{log.read()}")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def conn(*, me: LabHost, peer: LabHost, name: str, ike: str, esp: str) -> dict[str, Any]:
    """A host-to-host IKEv2 PSK tunnel config between the inside addresses."""
    return {
        "version": "2",
        "local_addrs": [me.ike_address],
        "remote_addrs": [peer.ike_address],
        "proposals": [ike],
        "mobike": "no",
        "local": {"auth": "psk", "id": me.name},
        "remote": {"auth": "psk", "id": peer.name},
        "children": {
            name: {
                "local_ts": [f"{me.inside_address}/32"],
                "remote_ts": [f"{peer.inside_address}/32"],
                "mode": "tunnel",
                "esp_proposals": [esp],
                "start_action": "none",
            }
        },
    }


def load_both(pair: Pair, name: str, ike: str, esp_left: str, esp_right: str | None = None) -> None:
    """Secret and conn on both ends, responder (right) first."""
    for me, peer, esp in ((pair.right, pair.left, esp_right or esp_left), (pair.left, pair.right, esp_left)):
        me.gateway.load_shared(name, PSK, [pair.left.host.name, pair.right.host.name])
        me.gateway.load_conn(name, conn(me=me.host, peer=peer.host, name=name, ike=ike, esp=esp))


def clean_up(pair: Pair, name: str) -> None:
    """Close the SAs of ``name`` and unload what was loaded, on both ends (best effort)."""
    for peer in (pair.left, pair.right):
        for sa in peer.gateway.list_sas(ike=name):
            with suppress(GatewayError):
                peer.gateway.terminate(ike_id=sa.uniqueid, timeout_ms=2000)
        with suppress(GatewayError):
            peer.gateway.unload_conn(name)
        with suppress(GatewayError):
            peer.gateway.unload_shared(name)


def sas(peer: Peer, name: str) -> list[IkeSa]:
    return peer.gateway.list_sas(ike=name)


def ping(pair: Pair, count: int = 2) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", pair.left.host.netns, "ping", "-c", str(count), "-W", "1",
         "-I", pair.left.host.inside_address, pair.right.host.inside_address],
        capture_output=True, text=True, timeout=15, check=False,
    )
