"""Loads that end by themselves (app.adapters.pending_loads), against a fake charon speaking VICI:
a set-up's load past its deadline is unloaded; a move's is replaced by the conn it replaced, the
tunnel's SAs and secret left alone; a released one is left as it is."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from app.adapters.pending_loads import PendingLoads, sweep
from tests.fakes.fake_charon import FakeCharon

_OLD = {"version": "2", "local_addrs": ["10.99.0.2"], "remote_addrs": ["10.99.0.1"],
        "proposals": ["aes128gcm16-prfsha256-x25519"],
        "children": {"peer-t1": {"esp_proposals": ["aes128gcm16-x25519"], "mode": "tunnel"}}}


def test_a_moves_load_past_its_deadline_is_replaced_by_the_old_conn(tmp_path: Path) -> None:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        pending = PendingLoads(tmp_path / "pending")
        pending.directory.mkdir(mode=0o700)
        pending.hold(socket_path=str(fake.socket_path), conn="peer-t1", until=time.time() + 60, restore=_OLD)
        assert sweep(pending.directory) == 0  # not yet
        assert fake.commands == []
        pending.hold(socket_path=str(fake.socket_path), conn="peer-t1", until=time.time() - 1, restore=_OLD)
        assert sweep(pending.directory) == 1
        assert fake.commands == ["load-conn"]  # no terminate, no unload: its SAs run on
        ((name, conn),) = fake.messages("load-conn")[0].items()
        assert name == "peer-t1"
        assert conn["children"]["peer-t1"]["esp_proposals"] == ["aes128gcm16-x25519"]
        assert list(pending.directory.glob("*.json")) == []


def test_a_set_ups_load_past_its_deadline_is_unloaded_and_a_released_one_is_left(tmp_path: Path) -> None:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        pending = PendingLoads(tmp_path / "pending")
        pending.directory.mkdir(mode=0o700)
        pending.hold(socket_path=str(fake.socket_path), conn="peer-t2", until=time.time() - 1, restore=_OLD)
        pending.release("peer-t2")
        pending.hold(socket_path=str(fake.socket_path), conn="peer-t3", until=time.time() - 1)
        assert sweep(pending.directory) == 1
        assert "load-conn" not in fake.commands
        assert [m.get("name") for m in fake.messages("unload-conn")] == ["peer-t3"]


def test_a_load_whose_charon_is_gone_ends_and_the_janitor_of_a_stopped_server_exits(tmp_path: Path) -> None:
    """A charon that stopped took its loaded conns with it: nothing is left to end, and the janitor
    (its server gone too) does not wait for that charon for ever."""
    pending = PendingLoads(tmp_path / "pending")
    pending.directory.mkdir(mode=0o700)
    pending.hold(socket_path=str(tmp_path / "gone.vici"), conn="peer-t4", until=time.time() - 1)
    listening = socket.socket(socket.AF_UNIX)  # bound but not listening: connecting is refused
    listening.bind(str(tmp_path / "refusing.vici"))
    try:
        pending.hold(socket_path=str(tmp_path / "refusing.vici"), conn="peer-t5", until=time.time() - 1,
                     restore=_OLD)
        assert sweep(pending.directory) == 2
    finally:
        listening.close()
    assert list(pending.directory.glob("*.json")) == []
    pending.hold(socket_path=str(tmp_path / "gone.vici"), conn="peer-t6", until=time.time() - 1)
    janitor = subprocess.run([sys.executable, "-m", "app.adapters.pending_loads", str(pending.directory),
                              str(_ended_pid())], timeout=30, check=False)
    assert janitor.returncode == 0
    assert list(pending.directory.glob("*.json")) == []


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid
