"""The service's own directory refuses links and other users' files, and writes files whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.adapters.state_dir import StateDir, UnsafeStateDir


def test_made_private_and_round_trips(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "var")
    state.write("plots", "a.png", data=b"x")
    assert state.read("plots", "a.png") == b"x"
    assert (tmp_path / "var").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "var" / "plots").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "var" / "plots" / "a.png").stat().st_mode & 0o777 == 0o600


def test_a_loose_root_is_closed(tmp_path: Path) -> None:
    (tmp_path / "var").mkdir(mode=0o755)
    os.chmod(tmp_path / "var", 0o755)  # noqa: S103 - the loose mode under test
    StateDir(tmp_path / "var").write("k", data=b"1")
    assert (tmp_path / "var").stat().st_mode & 0o777 == 0o700


def test_a_linked_file_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only")
    state = StateDir(tmp_path / "var")
    state.write("plots", "x.png", data=b"")
    (tmp_path / "var" / "plots" / "y.png").symlink_to(secret)
    with pytest.raises(UnsafeStateDir):
        state.read("plots", "y.png")


def test_a_linked_folder_is_never_written_into(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = StateDir(tmp_path / "var")
    state.write("k", data=b"")
    (tmp_path / "var" / "plots").symlink_to(elsewhere)
    with pytest.raises(UnsafeStateDir):
        state.write("plots", "report.md", data=b"planted?")
    assert list(elsewhere.iterdir()) == []


def test_a_group_writable_folder_is_refused(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "var")
    state.write("plots", "a.png", data=b"")
    os.chmod(tmp_path / "var" / "plots", 0o777)  # noqa: S103 - the loose mode under test
    with pytest.raises(UnsafeStateDir, match="writable by other users"):
        state.read("plots", "a.png")


def test_a_fifo_is_not_a_file(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "var")
    state.write("k", data=b"")
    os.mkfifo(tmp_path / "var" / "f")
    with pytest.raises(UnsafeStateDir, match="not a regular file"):
        state.read("f")


@pytest.mark.parametrize("name", ["..", ".", "a/b", ""])
def test_names_are_plain(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain"):
        StateDir(tmp_path).read(name)


def test_create_keeps_a_file_that_is_there_already(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "var")
    assert state.create("audit", "chain.key", data=b"first") is True
    assert state.create("audit", "chain.key", data=b"second") is False
    assert state.read("audit", "chain.key") == b"first"
    assert sorted(p.name for p in (tmp_path / "var" / "audit").iterdir()) == ["chain.key"]  # no temporary left
    assert (tmp_path / "var" / "audit" / "chain.key").stat().st_mode & 0o777 == 0o600
