"""The peers lab as an operator builds it: ``qoss lab up --peers`` under a prefix and a lab
directory of its own, ``qoss lab down`` after the module, also on failure.

:func:`peers_lab` yields what ``lab up --peers`` printed, parsed: ``{"sites": {"site-a": {"url",
"token", "gateway", "inside", "netns", "vici", "pid", "lab_url"}, "site-b": {...}}}``; ``url`` reaches
the site's API from this (the root) namespace, ``lab_url`` from the lab network. Both tokens join
the suite's leak sweep; the services', relays' and charons' logs are kept for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.lab.peers import MARK, PeersLab
from app.lab.processes import processes_with_env
from tests.fixtures.secrets import keep_log, register


@dataclass
class PeersCli:
    """``qoss lab …`` as an operator runs it, each command a process of its own, on a lab of its
    own (QOSS_LAB_DIR under ``root``, namespaces under ``prefix``)."""

    root: Path
    prefix: str
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.env = {**os.environ, "QOSS_LAB_DIR": str(self.lab_dir)}

    @property
    def lab_dir(self) -> Path:
        return self.root / "lab"

    @property
    def state_dir(self) -> Path:
        """Where the peers lab keeps everything."""
        return self.lab_dir / "peers"

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "app.cli", "lab", *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "app.cli", "lab", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def up(self) -> subprocess.CompletedProcess[str]:
        return self.run("up", "--peers", "--prefix", self.prefix)

    def leftovers(self) -> list[str]:
        """What of the lab is still there: namespaces, processes it started, its directory."""
        left = [f"namespace {p.name}" for p in Path("/run/netns").glob(f"{self.prefix}-*")]
        left += [f"process {pid} (lab)" for pid in processes_with_env(MARK, self.root)]
        left += [f"process {pid} (charon)" for pid in processes_with_env("STRONGSWAN_CONF", self.root)]
        if self.state_dir.exists():
            left.append(f"directory {self.state_dir}")
        return left

    def keep_logs(self, hint: str) -> None:
        """Copy every log of the lab into the leak sweep's directory."""
        logs = [*self.state_dir.glob("site-*/*.log"), *self.state_dir.glob("lab/site-*/charon.log")]
        for log in logs:
            keep_log(log, f"peers-{hint}-{log.parent.name}-{log.name}")

    def down(self) -> subprocess.CompletedProcess[str]:
        """``qoss lab down``; if it fails, the lab is taken down in this process as a last resort."""
        self.keep_logs("down")
        done = self.run("down")
        if done.returncode != 0:
            PeersLab(self.state_dir).down()
        return done


def peers_cli(hint: str) -> PeersCli:
    """A lab directory of its own in /tmp (short: UNIX socket paths) and a prefix of its own."""
    root = Path(tempfile.mkdtemp(prefix="qoss-peers-", dir="/tmp"))
    return PeersCli(root, f"{hint}{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}")


@pytest.fixture(scope="module")
def peers_cli_up() -> Iterator[tuple[PeersCli, subprocess.CompletedProcess[str]]]:
    """``qoss lab up --peers`` done (it must have succeeded) and its output; ``qoss lab down``
    after the module, which must leave nothing behind."""
    cli = peers_cli("pl")
    down: subprocess.CompletedProcess[str] | None = None
    try:
        up = cli.up()
        assert up.returncode == 0, up.stdout + up.stderr
        for site in json.loads(up.stdout)["sites"].values():
            register(site["token"])
        yield cli, up
    finally:
        try:
            down = cli.down()
        finally:
            left = cli.leftovers()
            shutil.rmtree(cli.root, ignore_errors=True)
    assert down is not None
    assert down.returncode == 0, down.stdout + down.stderr
    assert not left, left


@pytest.fixture(scope="module")
def peers_lab(peers_cli_up: tuple[PeersCli, subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    """What ``qoss lab up --peers`` printed, parsed: each site's url, token, gateway, inside, netns,
    vici, pid and lab_url; the lab is taken down after the module."""
    return dict(json.loads(peers_cli_up[1].stdout))
