"""The `qoss` command line, run as a real process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from app.settings import SHIPPED_POLICIES_DIR
from tests.cli.run import qoss


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A migrated SQLite database with the shipped tables and policies (the commands below need one)."""
    path = tmp_path / "q.db"
    done = qoss("db", "upgrade", db=path)
    assert done.returncode == 0, done.stderr
    return path


def test_negotiate_reads_the_api_document_and_prints_the_answer(db: Path) -> None:
    body = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 4}}]}
    out = qoss("negotiate", "-", db=db, stdin=json.dumps(body))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["suite"]["integrity"] == "sha1"


def test_negotiate_infeasible_exits_2_with_the_error_document(db: Path) -> None:
    body = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 9}}]}
    out = qoss("negotiate", "-", db=db, stdin=json.dumps(body))
    assert out.returncode == 2
    assert json.loads(out.stderr)["error"] == "NoFeasibleSuite"


def test_negotiate_invalid_document_exits_2(tmp_path: Path) -> None:
    out = qoss("negotiate", "-", db=tmp_path / "q.db", stdin='{"peers": [{"name": "a", "min_levels": {"x": 1}}]}')
    assert out.returncode == 2
    assert "ValidationError" in out.stderr


def test_policies_check_flags_invalid_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmin_levels: {integrity: 11}\n")
    out = qoss("policies", "check", str(SHIPPED_POLICIES_DIR / "voip.yaml"), str(bad), db=tmp_path / "q.db")
    assert out.returncode == 1
    assert "voip.yaml: ok" in out.stdout
    assert "bad.yaml: INVALID" in out.stdout


def test_ratings_export_import_round_trip(tmp_path: Path, db: Path) -> None:
    exported = qoss("ratings", "export", "esaf-2006", "--format", "csv", db=db)
    assert exported.returncode == 0, exported.stderr
    csv_file = tmp_path / "copy.csv"
    csv_file.write_text(exported.stdout)
    imported = qoss("ratings", "import", str(csv_file), "--name", "esaf-copy", db=db)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout) == {"name": "esaf-copy", "revision": 1, "ratings": 9}
    listed = json.loads(qoss("ratings", "list", db=db).stdout)
    assert {"esaf-2006", "esaf-copy", "standards-2026"} <= {t["name"] for t in listed}
    # The same CSV as a new revision of the table it came from: its description and source stay.
    before = yaml.safe_load(qoss("ratings", "export", "esaf-2006", db=db).stdout)
    again = qoss("ratings", "import", str(csv_file), "--name", "esaf-2006", "--revision", "1", db=db)
    assert again.returncode == 0, again.stderr
    after = yaml.safe_load(qoss("ratings", "export", "esaf-2006", db=db).stdout)
    assert (after["description"], after["source"]) == (before["description"], before["source"])
    assert before["description"]


@pytest.mark.charon
def test_lab_up_tunnel_up_ping_down(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    # Short path under /tmp: UNIX socket paths are limited to 107 bytes.
    lab_dir = Path(tempfile.mkdtemp(prefix="qoss-cli-lab-", dir="/tmp"))
    env = {"QOSS_LAB_DIR": str(lab_dir), "QOSS_LAB_PREFIX": f"qcl{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"}
    try:
        up = qoss("lab", "up", db=db, env=env)
        assert up.returncode == 0, up.stderr
        hosts = {h["name"]: h for h in json.loads(up.stdout)}
        assert set(hosts) == {"left", "right"}
        assert qoss("lab", "status", db=db, env=env).returncode == 0
        tunnel = qoss("tunnel", "up", "left", "right", "--confidentiality", "8", "--integrity", "8", db=db, env=env)
        assert tunnel.returncode == 0, tunnel.stderr
        tid = json.loads(tunnel.stdout)["id"]
        ping = subprocess.run(["ip", "netns", "exec", hosts["left"]["netns"], "ping", "-c", "2", "-W", "2", "-I",
                               hosts["left"]["inside_address"], hosts["right"]["inside_address"]],
                              capture_output=True, text=True, timeout=20, check=False)
        assert ping.returncode == 0, ping.stdout
        shown = json.loads(qoss("tunnel", "show", tid, db=db, env=env).stdout)
        assert shown["live"]["child_state"] == "INSTALLED"
        assert [t["id"] for t in json.loads(qoss("tunnel", "list", db=db, env=env).stdout)] == [tid]
        assert qoss("tunnel", "down", tid, db=db, env=env).returncode == 0
        assert json.loads(qoss("tunnel", "list", db=db, env=env).stdout) == []
    finally:
        down = qoss("lab", "down", db=db, env=env)
        assert down.returncode == 0, down.stderr
        assert qoss("lab", "status", db=db, env=env).returncode == 1
        shutil.rmtree(lab_dir, ignore_errors=True)


def test_bench_micro_writes_and_imports_a_measured_table(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
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
    answer = json.loads(qoss("negotiate", "-", db=db, stdin=json.dumps(body)).stdout)
    assert "measured" in answer["cost_unit"]
    Path(written["file"]).unlink()


def test_tunnel_up_to_a_peer_refuses_bad_input_without_echoing_the_psk(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    no_file = qoss("tunnel", "up", "left", "--peer", "10.99.0.2", "--remote-ts", "10.2.0.1/32", db=db)
    assert no_file.returncode == 2
    assert "--psk-file" in no_file.stderr
    short = tmp_path / "psk"
    short.write_text("short-secret-value\n")
    refused = qoss("tunnel", "up", "left", "--peer", "10.99.0.2", "--psk-file", str(short), "--remote-ts",
                   "10.2.0.1/32", db=db)
    assert refused.returncode == 2
    assert "psk" in refused.stderr
    assert "short-secret-value" not in refused.stderr + refused.stdout
    no_ts = tmp_path / "good"
    no_ts.write_text("p" * 40)
    both = qoss("tunnel", "up", "left", "right", "--peer", "10.99.0.2", "--psk-file", str(no_ts), db=db)
    assert both.returncode == 2
    assert "exactly one of responder" in both.stderr


def test_ratings_history_and_revert(tmp_path: Path, db: Path) -> None:
    edited = tmp_path / "esaf.yaml"
    exported = qoss("ratings", "export", "esaf-2006", db=db)
    assert exported.returncode == 0, exported.stderr
    edited.write_text(exported.stdout.replace("Blowfish", "Blowfish (edited)", 1))
    assert qoss("ratings", "import", str(edited), "--revision", "1", db=db).returncode == 0
    out = qoss("ratings", "revert", "esaf-2006", "--to", "1", "--message", "undo", db=db)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"table": "esaf-2006", "revision": 3, "reverted_to": 1}
    history = json.loads(qoss("ratings", "history", "esaf-2006", db=db).stdout)
    assert [(h["revision"], h["message"]) for h in history][-1] == (3, "reverted to 1: undo")
    assert qoss("ratings", "export", "esaf-2006", db=db).stdout == exported.stdout
    again = qoss("ratings", "revert", "esaf-2006", "--to", "3", db=db)
    assert again.returncode == 2
    assert json.loads(again.stderr)["error"] == "InvalidInput"


def test_policies_history_and_revert(db: Path) -> None:
    out = qoss("policies", "revert", "voip", "--to", "1", db=db)
    assert out.returncode == 2  # the current revision: nothing to revert
    missing = qoss("policies", "revert", "voip", "--to", "9", db=db)
    assert json.loads(missing.stderr)["error"] == "NotFound"
    assert [h["revision"] for h in json.loads(qoss("policies", "history", "voip", db=db).stdout)] == [1]


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


def test_ratings_edit_dry_run_keeps_nothing_then_the_edit_is_a_revision(db: Path) -> None:
    def revision() -> int:
        tables = json.loads(qoss("ratings", "list", db=db).stdout)
        return int(next(t["revision"] for t in tables if t["name"] == "standards-2026"))

    start = revision()
    dry = qoss("ratings", "edit", "standards-2026", "aes128gcm16", "--confidentiality", "5", "--dry-run", db=db)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"table": "standards-2026", "revision": start + 1, "dry_run": True, "impact": [],
                                       "sessions": []}
    assert revision() == start
    done = qoss("ratings", "edit", "standards-2026", "aes128gcm16", "--confidentiality", "5", db=db)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"table": "standards-2026", "revision": start + 1, "impact": [], "moved": 0,
                                       "not_moved": 0}
    assert revision() == start + 1
    history = json.loads(qoss("ratings", "history", "standards-2026", db=db).stdout)
    assert history[-1]["changes"] == [{"algorithm": "aes128gcm16", "field": "confidentiality", "old": 8, "new": 5}]
    refused = qoss("ratings", "edit", "standards-2026", "aes128gcm16", db=db)
    assert refused.returncode != 0
