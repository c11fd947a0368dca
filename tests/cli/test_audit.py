"""``qoss audit verify`` and ``qoss audit export``: a keyed chain, held against the checkpoints
kept outside the database. Run in-process (``CliRunner``: the same group and exit path as the
script; test_database.py runs commands as real processes)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from app.adapters.audit_seal import AuditSeal
from app.adapters.db import audit_chain
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.state_dir import StateDir
from app.cli.main import app
from app.domain.audit_chain import ChainKey, entry_hash, verify


def qoss(*args: str, db: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``qoss ARGS`` on ``db``, as a finished process (its status, stdout and stderr)."""
    done = CliRunner().invoke(app, list(args), env={"QOSS_DATABASE_URL": f"sqlite:///{db}", "QOSS_TOKEN": None,
                                                     **(env or {})})
    return subprocess.CompletedProcess(list(args), done.exit_code, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def four_entries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A database with four audit entries (each token create writes one) and the state directory
    of the process that wrote them (a checkpoint every 2 entries: at 1, where keying starts, 2
    and 4), made once."""
    made_in = tmp_path_factory.mktemp("audit")
    path, state = made_in / "qoss.db", made_in / "state"
    assert qoss("db", "upgrade", db=path, env={"QOSS_STATE_DIR": str(state)}).returncode == 0
    for i in range(4):
        made = qoss("token", "create", "--name", f"t{i}", "--scopes", "tunnels:read", "--plain", db=path,
                    env={"QOSS_STATE_DIR": str(state), "QOSS_AUDIT_CHECKPOINT_EVERY": "2"})
        assert made.returncode == 0, made.stderr
    return path, state


@pytest.fixture
def db(four_entries: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of that database and its state directory of this test's own (the tests alter them)."""
    source_path, source_state = four_entries
    path = tmp_path / "qoss.db"
    with sqlite3.connect(source_path) as source, sqlite3.connect(path) as target:
        source.backup(target)  # the WAL's content too
    shutil.copytree(source_state, tmp_path / "state")
    monkeypatch.setenv("QOSS_STATE_DIR", str(tmp_path / "state"))  # the qoss runs below inherit it
    return path


def key_of(state: Path) -> ChainKey:
    key = AuditSeal(StateDir(state)).read_key()
    assert key is not None
    return key


def rewrite(db: Path, *, start: int, change: Callable[[dict[str, Any]], None], key: ChainKey | None,
            drop_after: int | None = None) -> None:
    """What someone with write access to the database and no audit key can do: change entry
    ``start``, hash it and every entry after it again with ``key`` (None: the unkeyed formula),
    drop the entries after ``drop_after``, and point the head at the new last entry."""
    engine = make_engine(f"sqlite:///{db}")
    try:
        with make_session_factory(engine)() as session:
            rows = list(audit_chain.entries(session))
        if drop_after is not None:
            rows = [r for r in rows if r["id"] <= drop_after]
        prev = None
        with engine.begin() as conn:
            if drop_after is not None:
                conn.execute(text("DELETE FROM audit_events WHERE id > :id"), {"id": drop_after})
            for row in rows:
                if row["id"] == start:
                    change(row)
                if row["id"] >= start:
                    row["prev_hash"] = prev if prev is not None else row["prev_hash"]
                    row["hash"] = entry_hash(row, key)
                    conn.execute(text("UPDATE audit_events SET token_name = :token_name, detail = :detail, "
                                      "prev_hash = :prev_hash, hash = :hash WHERE id = :id"), row)
                prev = row["hash"]
            conn.execute(text("UPDATE audit_chain_head SET last_id = :id, hash = :hash"),
                         {"id": rows[-1]["id"], "hash": rows[-1]["hash"]})
    finally:
        engine.dispose()


def rename(row: dict[str, Any]) -> None:
    row["token_name"] = "someone else"


def test_verify_says_how_many_entries_and_that_the_chain_is_intact(db: Path) -> None:
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("4 entries, chain intact")
    assert "keyed from entry 1; 3 checkpoints agree" in out.stdout


def test_an_entry_rehashed_onward_without_the_key_is_named(db: Path) -> None:
    rewrite(db, start=3, change=rename, key=None)  # the unkeyed formula, head rewritten
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "at entry 3: entry 3 altered" in out.stdout
    assert "entry 4" not in out.stdout


def test_an_entry_rehashed_onward_with_a_guessed_key_is_named(db: Path) -> None:
    rewrite(db, start=3, change=rename, key=ChainKey.derive(b"a guess at the key, 32 bytes long"))
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "at entry 3: entry 3 altered" in out.stdout


def test_a_cut_tail_with_the_head_rewritten_is_found_by_the_checkpoint(db: Path) -> None:
    rewrite(db, start=5, change=rename, key=None, drop_after=2)  # entries 3 and 4 gone, head at entry 2
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "tail cut after entry 2 (checkpoint 4)" in out.stdout
    assert "the chain ends at entry 2 but the checkpoint" in out.stdout


def test_a_checkpoint_file_of_another_replica_is_read_too(db: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-replica.jsonl"
    (tmp_path / "state" / "audit" / "checkpoints.jsonl").rename(other)
    rewrite(db, start=5, change=rename, key=None, drop_after=3)
    assert qoss("audit", "verify", db=db).returncode == 0  # no checkpoint here: only the head, rewritten
    out = qoss("audit", "verify", "--checkpoints", str(other), db=db)
    assert out.returncode == 1
    assert "tail cut after entry 3 (checkpoint 4)" in out.stdout


def test_an_altered_checkpoint_file_is_refused(db: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "state" / "audit" / "checkpoints.jsonl"
    lines = checkpoints.read_text().splitlines()
    forged = {**json.loads(lines[-1]), "last_id": 3}
    checkpoints.write_text("\n".join([*lines[:-1], json.dumps(forged)]) + "\n")
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 2
    assert "line 3" in out.stderr
    assert "does not match its MAC" in out.stderr


def test_without_the_key_a_keyed_chain_is_not_called_intact(db: Path, tmp_path: Path) -> None:
    (tmp_path / "state" / "audit" / "checkpoints.jsonl").unlink()
    (tmp_path / "state" / "audit" / "chain.key").unlink()
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "no audit key at" in out.stdout
    made = qoss("token", "create", "--name", "late", "--scopes", "tunnels:read", "--plain", db=db)
    assert made.returncode == 2  # no new key for a keyed chain: it could never be verified
    assert made.stderr.startswith("qoss: the audit chain is keyed")
    assert len(made.stderr.splitlines()) == 1
    assert not (tmp_path / "state" / "audit" / "chain.key").exists()


def test_an_older_unkeyed_chain_still_verifies_and_is_keyed_onward(db: Path, tmp_path: Path) -> None:
    rewrite(db, start=1, change=lambda row: None, key=None)  # as the chain was before keying
    shutil.rmtree(tmp_path / "state")  # and no key nor checkpoint yet
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 0, out.stdout
    assert "4 entries, chain intact" in out.stdout
    assert "unkeyed" in out.stdout
    made = qoss("token", "create", "--name", "t4", "--scopes", "tunnels:read", "--plain", db=db)
    assert made.returncode == 0, made.stderr
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 0, out.stdout
    assert "5 entries, chain intact" in out.stdout
    assert "keyed from entry 5; 1 checkpoints agree" in out.stdout
    rewrite(db, start=5, change=rename, key=None)  # the keyed part cannot go back to the old formula
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "at entry 5: entries up to 5 rewritten" in out.stdout  # the checkpoint recorded another entry 5


def test_verify_names_the_entry_after_a_removed_one(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit_events WHERE id = 2")
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "at entry 3" in out.stdout


def test_export_writes_json_lines_a_siem_can_check_with_the_key(db: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "audit.jsonl"
    assert qoss("audit", "export", "--out", str(out_file), db=db).returncode == 0
    entries = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [e["id"] for e in entries] == [1, 2, 3, 4]
    key = key_of(tmp_path / "state")
    assert all(entry_hash(e, key) == e["hash"] for e in entries)
    assert verify(entries, key=key).intact
    assert not verify(entries).intact  # without the key, no one can tell them from forgeries
    later = qoss("audit", "export", "--since", "2", db=db)
    assert later.returncode == 0
    assert [json.loads(line) for line in later.stdout.splitlines()] == entries[2:]
