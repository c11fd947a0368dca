"""Fixtures shared by the integration tests of more than one area."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.lab.hosts import Lab, LabHost
from tests.fixtures.secrets import keep_log


@pytest.fixture(scope="module")
def lab6(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """Two charons with IKE over IPv6 (``left`` ``fd00:71::1``, ``right`` ``fd00:71::2``) and inside
    addresses of both families (``families=(6, 4)``), under a unique prefix: one per module, always
    taken down, the charons' logs kept for the secret sweep."""
    state = Path(tempfile.mkdtemp(prefix="qoss-v6-", dir="/tmp"))  # short: UNIX socket paths
    lab = Lab(state, prefix=f"v6{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}", families=(6, 4))
    module = request.module.__name__.rsplit(".", 1)[-1]
    hosts: list[LabHost] = []
    try:
        hosts = lab.up()
        yield lab
    finally:
        try:
            lab.down()
        finally:
            for host in hosts:
                keep_log(host.log_path, f"charon-{module}-{host.name}.log")
            shutil.rmtree(state, ignore_errors=True)
