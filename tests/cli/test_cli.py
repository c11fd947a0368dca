"""The ``qoss`` command line run as a real process, with the lab: ``lab up``, a tunnel through the
service, ``lab down``; the agent lab; ``bench micro --write-table``. (The commands that go through
the service are tested in test_through_service.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.run import qoss
from tests.cli.service import Service, served


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A running qoss whose database the lab's gateways are registered in (lab sockets under /tmp)."""
    with served(tmp_path_factory.mktemp("cli-lab"), QOSS_VICI_SOCKET_DIRS='["/tmp"]') as running:
        yield running


def _db(service: Service) -> Path:
    return Path(service.database_url.removeprefix("sqlite:///"))


@pytest.mark.charon
def test_lab_up_tunnel_up_ping_down(service: Service) -> None:
    db = _db(service)
    # Short path under /tmp: UNIX socket paths are limited to 107 bytes.
    lab_dir = Path(tempfile.mkdtemp(prefix="qoss-cli-lab-", dir="/tmp"))
    env = {"QOSS_LAB_DIR": str(lab_dir), "QOSS_LAB_PREFIX": f"qcl{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"}
    try:
        up = qoss("lab", "up", db=db, env=env)
        assert up.returncode == 0, up.stderr
        hosts = {h["name"]: h for h in json.loads(up.stdout)}
        assert set(hosts) == {"left", "right"}
        assert qoss("lab", "status", db=db, env=env).returncode == 0
        tunnel = service.cli("tunnel", "up", "left", "right", "--confidentiality", "8", "--integrity", "8")
        assert tunnel.exit_code == 0, tunnel.stderr
        tid = json.loads(tunnel.stdout)["id"]
        ping = subprocess.run(["ip", "netns", "exec", hosts["left"]["netns"], "ping", "-c", "2", "-W", "2", "-I",
                               hosts["left"]["inside_address"], hosts["right"]["inside_address"]],
                              capture_output=True, text=True, timeout=20, check=False)
        assert ping.returncode == 0, ping.stdout
        shown = json.loads(service.cli("tunnel", "show", tid).stdout)
        assert shown["live"]["child_state"] == "INSTALLED"
        assert [t["id"] for t in json.loads(service.cli("tunnel", "list").stdout)] == [tid]
        table = service.cli("tunnel", "list", "-o", "table").stdout.splitlines()
        assert table[0].split()[:2] == ["ID", "STATE"]
        assert table[1].split()[:2] == [tid, "up"]
        assert service.cli("tunnel", "down", tid).exit_code == 0
        assert json.loads(service.cli("tunnel", "list").stdout) == []
    finally:
        down = qoss("lab", "down", db=db, env=env)
        assert down.returncode == 0, down.stderr
        assert qoss("lab", "status", db=db, env=env).returncode == 1
        shutil.rmtree(lab_dir, ignore_errors=True)


def test_bench_micro_writes_and_imports_a_measured_table(tmp_path: Path, service: Service) -> None:
    db = _db(service)
    out = qoss("bench", "micro", "--only", "aes128gcm16,chacha20poly1305,sha256,aes128,x25519", "--budget", "0.2",
               "--write-table", "measured-test", "--out", str(tmp_path / "micro.json"), db=db)
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout[out.stdout.index("{\n"):])
    assert written["table"] == "measured-test"
    assert written["ratings"] == 5
    raw = json.loads((tmp_path / "micro.json").read_text())
    assert {r["algorithm"] for r in raw["results"]} >= {"aes128gcm16", "x25519"}
    body = {"rating_table": "measured-test", "peers": [{"name": "a", "min_levels": {"confidentiality": 8}}],
            "traffic": {"packet_size": 1400}}
    answer = json.loads(service.cli("negotiate", "-", stdin=json.dumps(body)).stdout)
    assert "measured" in answer["cost_unit"]
    Path(written["file"]).unlink()


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{prefix}-")]


def _charons_of(lab_dir: Path) -> list[int]:
    """Live charons whose STRONGSWAN_CONF lies under ``lab_dir`` (the lab's own)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if "charon" not in (proc / "comm").read_text() or " Z " in (proc / "stat").read_text():
                continue
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"STRONGSWAN_CONF={lab_dir}".encode() in env:
            found.append(int(proc.name))
    return found


def test_lab_up_agent_join_two_users_down_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    lab_dir = Path(tempfile.mkdtemp(prefix="qoss-cli-agent-", dir="/tmp"))
    prefix = f"qca{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"
    env = {"QOSS_LAB_DIR": str(lab_dir), "QOSS_LAB_PREFIX": prefix}
    try:
        refused = qoss("lab", "join", "alice", db=db, env=env)
        assert refused.returncode != 0
        assert "qoss lab up --agent" in refused.stderr
        up = qoss("lab", "up", "--agent", db=db, env=env)
        assert up.returncode == 0, up.stderr
        parts = ("client", "host", "target", "device", "hub")
        assert sorted(_namespaces(prefix)) == sorted(f"{prefix}-{n}" for n in parts)
        ips = set()
        for user in ("alice", "bob"):
            joined = qoss("lab", "join", user, db=db, env=env)
            assert joined.returncode == 0, joined.stderr
            report = json.loads(joined.stdout)
            assert report["user"] == user
            assert report["enrolled"] is True
            assert report["suite"]["child"].startswith("ESP:")
            assert report["ping"]["received"] == report["ping"]["transmitted"] > 0
            assert report["ping"]["esp_packets"]["in"] > 0  # the ping went through the SA, not around it
            ips.add(report["virtual_ip"])
        assert len(ips) == 2
    finally:
        down = qoss("lab", "down", db=db, env=env)
        leftover_ns, leftover_charons = _namespaces(prefix), _charons_of(lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert leftover_ns == []
    assert leftover_charons == []
