"""A fake charon on a short-path UNIX socket for each test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.adapters.vici import ViciGateway
from tests.fakes import FakeCharon


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # UNIX socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="vici-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake(socket_dir: Path) -> Iterator[FakeCharon]:
    with FakeCharon(socket_dir / "charon.vici") as charon:
        yield charon


@pytest.fixture
def gateway(fake: FakeCharon) -> ViciGateway:
    return ViciGateway(fake.socket_path, timeout=2.0)
