"""Reused VICI sessions: one connection for many commands, dead or broken ones never reused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.adapters.vici import ViciGateway
from app.adapters.vici.session import SessionPool, ViciSession, unix_connect
from app.domain.errors import GatewayRejected, GatewayUnreachable
from tests.fakes import FakeCharon, Reply, ike_sa_message


class Counting:
    """The production connect, counting the connections it opens and closes."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0

    @contextmanager
    def __call__(self, path: str, timeout: float) -> Iterator[ViciSession]:
        self.opened += 1
        try:
            with unix_connect(path, timeout) as session:
                yield session
        finally:
            self.closed += 1


@pytest.fixture
def connect() -> Counting:
    return Counting()


@pytest.fixture
def pool() -> Iterator[SessionPool]:
    pool = SessionPool(max_idle=2)
    yield pool
    pool.close()


def _gateway(fake: FakeCharon, connect: Counting, pool: SessionPool, timeout: float = 2.0) -> ViciGateway:
    return ViciGateway(fake.socket_path, timeout, connect=connect, pool=pool)


def test_one_connection_serves_many_commands_and_gateways(fake: FakeCharon, connect: Counting,
                                                          pool: SessionPool) -> None:
    fake.sas["a"] = ike_sa_message()
    for _ in range(3):
        gateway = _gateway(fake, connect, pool)  # made per use, as the services do
        assert gateway.version().daemon == "charon"
        assert [sa.name for sa in gateway.list_sas()] == ["a"]
        gateway.load_conn("c", {"children": {"c": {}}})
        assert gateway.initiate(child="c", timeout_ms=1000) is not None
    # one per timeout: initiate waits its timeout_ms on top, on a session of its own kind
    assert connect.opened == 2
    assert fake.listeners("control-log") == 0  # the streamed commands unregistered their events
    pool.close()
    assert connect.closed == 2


def test_no_pool_opens_a_connection_per_command(fake: FakeCharon, connect: Counting) -> None:
    gateway = ViciGateway(fake.socket_path, 2.0, connect=connect, pool=None)
    gateway.version()
    gateway.version()
    assert (connect.opened, connect.closed) == (2, 2)


def test_a_session_in_use_is_never_shared(fake: FakeCharon, connect: Counting, pool: SessionPool) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(message: dict[str, object]) -> Reply:
        started.set()
        release.wait(2)
        return Reply(fake.version)

    fake.script("version", slow, once=True)
    gateway = _gateway(fake, connect, pool)
    thread = threading.Thread(target=gateway.version)
    thread.start()
    assert started.wait(2)
    assert gateway.stats().backend  # a second connection while the first waits
    release.set()
    thread.join(2)
    assert connect.opened == 2
    assert pool.idle((connect, fake.socket_path, 2.0)) == 2


def test_the_pool_is_bounded(fake: FakeCharon, connect: Counting, pool: SessionPool) -> None:
    gates = [threading.Event() for _ in range(3)]
    arrived = threading.Semaphore(0)

    def hold(message: dict[str, object]) -> Reply:
        arrived.release()
        gates[int(str(message["name"]))].wait(2)
        return Reply({"success": "yes"})

    fake.script("unload-conn", hold)
    gateway = _gateway(fake, connect, pool)
    threads = [threading.Thread(target=gateway.unload_conn, args=(str(i),)) for i in range(3)]
    for t in threads:
        t.start()
    for _ in threads:
        assert arrived.acquire(timeout=2)
    for gate, t in zip(gates, threads, strict=True):
        gate.set()
        t.join(2)
    assert connect.opened == 3
    assert pool.idle((connect, fake.socket_path, 2.0)) == 2
    assert connect.closed == 1


def test_an_idle_session_charon_closed_is_replaced(socket_dir: Path, connect: Counting, pool: SessionPool) -> None:
    path = socket_dir / "charon.vici"
    with FakeCharon(path) as first:
        gateway = _gateway(first, connect, pool)
        gateway.version()
    with FakeCharon(path) as restarted:  # charon restarted: the idle session is dead
        restarted.conns["c"] = {}
        gateway.unload_conn("c")  # not repeatable, so it must not even be tried on the dead session
        assert restarted.commands == ["unload-conn"]
    assert connect.opened == 2


def test_a_session_with_a_socket_error_is_dropped(fake: FakeCharon, connect: Counting, pool: SessionPool) -> None:
    gateway = _gateway(fake, connect, pool, timeout=0.3)
    fake.drop("stats")
    with pytest.raises(GatewayUnreachable):
        gateway.stats()
    key = (connect, fake.socket_path, 0.3)
    assert pool.idle(key) == 0
    assert connect.closed == connect.opened
    gateway.version()
    assert pool.idle(key) == 1


def test_a_session_that_timed_out_is_dropped(fake: FakeCharon, connect: Counting, pool: SessionPool) -> None:
    release = threading.Event()
    fake.script("version", lambda message: (release.wait(2), Reply(fake.version))[1], once=True)
    gateway = _gateway(fake, connect, pool, timeout=0.2)
    with pytest.raises(GatewayUnreachable, match="no answer"):
        gateway.version()
    release.set()
    assert pool.idle((connect, fake.socket_path, 0.2)) == 0
    # the late answer went to the closed session, not to the next command
    assert gateway.stats().backend
    assert fake.count("version") == 1


def test_charons_refusal_keeps_the_session(fake: FakeCharon, connect: Counting, pool: SessionPool) -> None:
    fake.fail("initiate", "establishing CHILD_SA 'c' failed", log=["received NO_PROPOSAL_CHOSEN notify"])
    gateway = _gateway(fake, connect, pool)
    with pytest.raises(GatewayRejected, match="NO_PROPOSAL_CHOSEN"):
        gateway.initiate(child="c", timeout_ms=1000)
    assert fake.listeners("control-log") == 0
    with pytest.raises(GatewayRejected):
        gateway.initiate(child="c", timeout_ms=1000)
    assert connect.opened == 1


def test_a_failed_non_repeatable_command_is_not_sent_again(fake: FakeCharon, connect: Counting,
                                                           pool: SessionPool) -> None:
    gateway = _gateway(fake, connect, pool)
    gateway.version()  # one idle session
    fake.script("terminate", Reply(drop=True), once=True)
    with pytest.raises(GatewayUnreachable):
        gateway.terminate(ike="c", timeout_ms=100)
    assert fake.count("terminate") == 1


def test_a_repeatable_command_is_sent_once_more_on_a_new_session(fake: FakeCharon, connect: Counting,
                                                                 pool: SessionPool) -> None:
    gateway = _gateway(fake, connect, pool)
    gateway.version()  # one idle session
    fake.script("load-conn", Reply(drop=True), once=True)
    gateway.load_conn("c", {"children": {"c": {}}})
    assert fake.count("load-conn") == 2
    assert "c" in fake.conns
    assert connect.opened == 2
