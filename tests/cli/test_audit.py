"""``qoss audit verify`` and ``qoss audit export`` as a user runs them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.domain.audit_chain import entry_hash, verify
from tests.cli.run import qoss


@pytest.fixture(scope="module")
def four_entries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with four audit entries (each token create writes one), made once."""
    path = tmp_path_factory.mktemp("audit") / "qoss.db"
    for i in range(4):
        made = qoss("token", "create", "--name", f"t{i}", "--scopes", "tunnels:read", "--plain", db=path)
        assert made.returncode == 0, made.stderr
    return path


@pytest.fixture
def db(four_entries: Path, tmp_path: Path) -> Path:
    """A copy of that database of this test's own (the tests alter it)."""
    path = tmp_path / "qoss.db"
    with sqlite3.connect(four_entries) as source, sqlite3.connect(path) as target:
        source.backup(target)  # the WAL's content too
    return path


def test_verify_says_how_many_entries_and_that_the_chain_is_intact(db: Path) -> None:
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("4 entries, chain intact")


def test_verify_names_the_altered_entry_and_exits_1(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE audit_events SET token_name = 'someone else' WHERE id = 3")
    out = qoss("audit", "verify", "--database-url", f"sqlite:///{db}")
    assert out.returncode == 1
    assert "entry 3" in out.stdout
    assert "entry 4" not in out.stdout


def test_verify_names_the_entry_after_a_removed_one(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit_events WHERE id = 2")
    out = qoss("audit", "verify", db=db)
    assert out.returncode == 1
    assert "at entry 3" in out.stdout


def test_export_writes_json_lines_a_siem_can_check(db: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "audit.jsonl"
    assert qoss("audit", "export", "--out", str(out_file), db=db).returncode == 0
    entries = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [e["id"] for e in entries] == [1, 2, 3, 4]
    assert all(entry_hash(e) == e["hash"] for e in entries)
    assert verify(entries).intact
    later = qoss("audit", "export", "--since", "2", db=db)
    assert later.returncode == 0
    assert [json.loads(line) for line in later.stdout.splitlines()] == entries[2:]
