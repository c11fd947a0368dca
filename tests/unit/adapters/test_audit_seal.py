"""The audit key and checkpoints outside the database: a private key file, links refused, a new
key only for a chain empty or unkeyed so far."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.adapters.audit_seal import AuditKeyError, AuditSeal, BadCheckpoint
from app.adapters.db.audit_chain import ChainWriter
from app.adapters.state_dir import StateDir, UnsafeStateDir
from app.domain.audit_chain import GENESIS, ChainKey, Checkpoint, link


def entry(key: ChainKey | None) -> dict[str, object]:
    record = {"at": datetime(2026, 11, 26, tzinfo=UTC), "request_id": "r", "client_request_id": None,
              "token_id": None, "token_name": None, "scopes": [], "source": "cli", "action": "POST",
              "object": "/v1/tokens", "outcome": 201, "detail": ""}
    return link([record], ids=[1], prev_hash=GENESIS, key=key)[0]


def test_the_key_is_made_0600_in_a_0700_folder(tmp_path: Path) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"))
    assert seal.read_key() is None
    key = seal.make_key()
    path = tmp_path / "var" / "audit" / "chain.key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert len(path.read_bytes()) == 32
    assert seal.read_key() == key
    assert seal.make_key() == key  # made once: a second call (or process) gets the same one
    assert [p.name for p in path.parent.iterdir()] == ["chain.key"]


def test_a_linked_key_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "planted"
    elsewhere.write_bytes(os.urandom(32))
    (tmp_path / "var" / "audit").mkdir(parents=True, mode=0o700)
    (tmp_path / "var" / "audit" / "chain.key").symlink_to(elsewhere)
    with pytest.raises(UnsafeStateDir, match="link"):
        AuditSeal(StateDir(tmp_path / "var")).read_key()


def test_an_operator_key_file_is_read_never_made_and_never_a_link(tmp_path: Path) -> None:
    shared = tmp_path / "shared.key"
    seal = AuditSeal(StateDir(tmp_path / "var"), key_file=shared)
    with pytest.raises(AuditKeyError, match="never makes"):
        seal.make_key()
    shared.write_bytes(os.urandom(48))
    shared.chmod(0o640)
    assert seal.read_key() == ChainKey.derive(shared.read_bytes())
    shared.chmod(0o644)
    with pytest.raises(UnsafeStateDir, match="readable"):
        seal.read_key()
    shared.chmod(0o600)
    (tmp_path / "link.key").symlink_to(shared)
    with pytest.raises(UnsafeStateDir, match="link"):
        AuditSeal(StateDir(tmp_path / "var"), key_file=tmp_path / "link.key").read_key()
    shared.write_bytes(b"short")
    with pytest.raises(AuditKeyError, match="32 bytes"):
        seal.read_key()


def test_a_keyed_chain_without_its_key_is_refused_and_no_key_is_made(tmp_path: Path) -> None:
    other = ChainKey.derive(os.urandom(32))
    writer = ChainWriter(AuditSeal(StateDir(tmp_path / "var")))
    with pytest.raises(AuditKeyError, match="keyed"):
        writer.open(entry(other))
    assert not (tmp_path / "var" / "audit" / "chain.key").exists()


def test_a_chain_keyed_with_another_key_is_refused(tmp_path: Path) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"))
    seal.make_key()
    with pytest.raises(AuditKeyError, match="same key file"):
        ChainWriter(seal).open(entry(ChainKey.derive(os.urandom(32))))


@pytest.mark.parametrize("keyed", [False, True], ids=["empty", "unkeyed-so-far"])
def test_an_empty_or_unkeyed_chain_gets_a_key(tmp_path: Path, keyed: bool) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"))
    key = ChainWriter(seal).open(entry(None) if keyed else None)
    assert seal.read_key() == key


def test_checkpoints_are_due_when_keying_starts_and_every_n(tmp_path: Path) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"), checkpoint_every=10)
    writer = ChainWriter(seal)
    writer.open(None)
    first = writer.due(None, [{"id": 1, "hash": "a" * 64}])
    assert first is not None
    writer.write(first)
    assert writer.due(1, [{"id": 2, "hash": "b" * 64}]) is None
    assert writer.due(8, [{"id": 9, "hash": "c" * 64}]) is None
    assert writer.due(9, [{"id": 10, "hash": "d" * 64}]) is not None
    assert writer.due(9, [{"id": 13, "hash": "e" * 64}]) is not None  # ids a rollback skipped
    key = seal.read_key()
    assert key is not None
    assert seal.read_checkpoints(key) == [first]


def test_a_forged_checkpoint_line_is_refused(tmp_path: Path) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"))
    key = seal.make_key()
    seal.write_checkpoint(Checkpoint(3, "f" * 64, "2026-11-26T00:00:00.000000Z"), key)
    path = tmp_path / "var" / "audit" / "checkpoints.jsonl"
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text(path.read_text().replace('"last_id":3', '"last_id":30'))
    with pytest.raises(BadCheckpoint, match="line 1"):
        seal.read_checkpoints(key)
