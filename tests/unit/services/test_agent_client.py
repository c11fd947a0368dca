"""The agent client against a fake charon that speaks the real VICI protocol: the cache of its
charon's capabilities (read once, kept in memory and in the state directory, read again after
a charon restart, after the TTL, or when asked to), and the ``child-updown`` watch that spares
a ``list-sas`` after initiate."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.adapters.agent.crypto import KeyPair
from app.adapters.vici.driver import ViciGateway
from app.services.agent_client import CAPABILITIES_TTL, AgentClient
from app.services.agent_config import ClientConfig, Party
from tests.fakes.fake_charon import FakeCharon

HOST = KeyPair.generate("host-1")
TARGET = KeyPair.generate("target-1")
USER = KeyPair.generate("alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def charon(tmp_path: Path) -> Iterator[FakeCharon]:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        yield fake


def client(tmp_path: Path, socket_path: str, clock: Clock) -> AgentClient:
    config = ClientConfig(
        user="alice", key_dir=tmp_path / "keys",
        host={"id": "host-1", "url": "http://127.0.0.1:9", **HOST.public.as_dict()},
        targets={"target-1": Party(**TARGET.public.as_dict())},
        vici_socket=socket_path, state_dir=tmp_path / "state",
    )
    return AgentClient(config=config, keys=USER, vici=ViciGateway(socket_path, timeout=2.0), clock=clock)


def reads(fake: FakeCharon) -> int:
    return fake.count("get-algorithms") + fake.count("stats")


def test_read_once_then_cached_in_memory_and_on_disk(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    first = client(tmp_path, charon.socket_path, clock)
    algorithms, native = first.capabilities()
    assert "aes128gcm16" in algorithms
    assert native is False  # kernel-libipsec: no AH, no transport mode
    assert reads(charon) == 2
    assert first.capabilities() == (algorithms, native)
    assert reads(charon) == 2
    # A new process (the next `qoss agent connect`) finds the state directory's copy.
    again = client(tmp_path, charon.socket_path, clock)
    assert again.capabilities() == (algorithms, native)
    assert reads(charon) == 2
    path = tmp_path / "state" / "capabilities.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert again.tunnels() == []  # the cache file is not a tunnel


def test_refresh_reads_again(tmp_path: Path, charon: FakeCharon) -> None:
    c = client(tmp_path, charon.socket_path, Clock())
    c.capabilities()
    charon.algorithms["aead"].pop("CHACHA20_POLY1305")
    assert "chacha20poly1305" in c.capabilities()[0]
    assert "chacha20poly1305" not in c.capabilities(refresh=True)[0]
    assert reads(charon) == 4


def test_a_restarted_charon_is_read_again(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    c = client(tmp_path, charon.socket_path, clock)
    assert c.capabilities()[1] is False
    charon.stop()
    with FakeCharon(charon.socket_path) as restarted:
        restarted.plugins.remove("kernel-libipsec")  # now kernel-netlink: AH and transport possible
        assert c.capabilities()[1] is True
        assert reads(restarted) == 2
        assert client(tmp_path, charon.socket_path, clock).capabilities()[1] is True
        assert reads(restarted) == 2


def test_read_again_after_the_ttl(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    c = client(tmp_path, charon.socket_path, clock)
    c.capabilities()
    clock.now += CAPABILITIES_TTL - 1
    c.capabilities()
    assert reads(charon) == 2
    clock.now += 2
    c.capabilities()
    assert reads(charon) == 4


def test_a_damaged_cache_file_is_ignored(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    client(tmp_path, charon.socket_path, clock).capabilities()
    path = tmp_path / "state" / "capabilities.json"
    raw = json.loads(path.read_text())
    for bad in ("not json", json.dumps({**raw, "algorithms": "aes128"}), json.dumps({**raw, "native": "yes"})):
        path.write_text(bad)
        before = reads(charon)
        assert "aes128" in client(tmp_path, charon.socket_path, clock).capabilities()[0]
        assert reads(charon) == before + 2


# --------------------------------------------------------------------------- child-updown instead of list-sas


def test_up_watch_hands_over_the_ike_sa_of_the_conn(charon: FakeCharon) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from app.services.agent_client import _UpWatch
    from tests.fakes.fake_charon import child_sa_message, ike_sa_message

    with ThreadPoolExecutor(max_workers=1) as pool:
        watch = _UpWatch(charon.socket_path, pool)
        deadline = time.monotonic() + 5
        while charon.listeners("child-updown") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        child = child_sa_message(name="conn-a")
        charon.emit("child-updown", {"up": "no", "conn-a": ike_sa_message(uniqueid=1)})  # down: ignored
        charon.emit("child-updown", {"up": "yes", "conn-b": ike_sa_message(uniqueid=2)})
        charon.emit("child-updown", {"up": "yes", "conn-a": ike_sa_message(
            uniqueid=3, children={"conn-a": child})})
        sa = watch.wait("conn-a")
        assert sa is not None
        assert (sa.name, sa.uniqueid) == ("conn-a", 3)
        assert [c.name for c in sa.children] == ["conn-a"]
        assert watch.wait("conn-c", timeout=0.05) is None
        watch.stop()


def test_up_watch_without_a_charon_gives_none(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from app.services.agent_client import _UpWatch

    with ThreadPoolExecutor(max_workers=1) as pool:
        watch = _UpWatch(str(tmp_path / "nothing.vici"), pool)
        assert watch.wait("conn-a") is None
        watch.stop()
