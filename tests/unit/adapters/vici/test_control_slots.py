"""Control calls that wait in charon (initiate, terminate) are bounded per charon, and a connect
that finds charon's accept queue full is tried again within its timeout."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.adapters.vici import ViciGateway
from app.adapters.vici.session import unix_connect
from app.adapters.vici.slots import CONTROL_SLOTS
from app.domain.errors import GatewayUnreachable
from tests.fakes import FakeCharon
from tests.fakes.fake_charon import Reply


@pytest.fixture
def one_slot() -> Iterator[None]:
    before = CONTROL_SLOTS.per_socket
    CONTROL_SLOTS.configure(1)
    try:
        yield
    finally:
        CONTROL_SLOTS.configure(before)


def test_a_second_initiate_waits_until_the_first_is_answered(fake: FakeCharon, one_slot: None) -> None:
    release, inside = threading.Event(), threading.Semaphore(0)
    concurrent = {"now": 0, "most": 0}
    lock = threading.Lock()

    def slow(message: dict[str, object]) -> Reply:
        with lock:
            concurrent["now"] += 1
            concurrent["most"] = max(concurrent["most"], concurrent["now"])
        inside.release()
        release.wait(5)
        with lock:
            concurrent["now"] -= 1
        return Reply({"success": "yes"})

    fake.script("initiate", slow)
    gateway = ViciGateway(fake.socket_path, timeout=5.0)
    threads = [threading.Thread(target=gateway.initiate, kwargs={"child": f"c{i}", "timeout_ms": 1000})
               for i in range(3)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=5)  # one is in charon
    assert not inside.acquire(timeout=0.3)  # the others wait here, not in charon
    release.set()
    for t in threads:
        t.join(10)
    assert concurrent["most"] == 1
    assert len(fake.messages("initiate")) == 3


def test_no_slot_within_the_calls_own_time_is_a_clear_busy_error(fake: FakeCharon, one_slot: None) -> None:
    release, inside = threading.Event(), threading.Event()

    def stuck(message: dict[str, object]) -> Reply:
        inside.set()
        release.wait(5)
        return Reply({"success": "yes"})

    fake.script("initiate", stuck)
    first = threading.Thread(target=ViciGateway(fake.socket_path, timeout=5.0).initiate,
                             kwargs={"child": "first", "timeout_ms": 1000})
    first.start()
    try:
        assert inside.wait(5)
        with pytest.raises(GatewayUnreachable, match="busy"):
            ViciGateway(fake.socket_path, timeout=0.2).initiate(child="second", timeout_ms=0)
    finally:
        release.set()
        first.join(10)
    # another charon has slots of its own
    assert CONTROL_SLOTS.take("/elsewhere/charon.vici", 0) is not None


def test_a_connect_to_a_full_accept_queue_is_tried_again_until_it_is_taken(socket_dir: Path) -> None:
    path = str(socket_dir / "slow.vici")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    queued = []
    try:
        while True:  # fill the queue of connections not yet accepted
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(path)
            except BlockingIOError:
                c.close()
                break
            queued.append(c)
            assert len(queued) < 100
        with pytest.raises(TimeoutError), unix_connect(path, 0.2):
            pass  # never accepted within the time: a time-out, not "resource temporarily unavailable"

        def accept_soon() -> None:
            threading.Event().wait(0.2)
            for _ in range(len(queued) + 1):
                server.accept()[0].close()

        acceptor = threading.Thread(target=accept_soon)
        acceptor.start()
        with unix_connect(path, 5.0) as session:
            assert session is not None
        acceptor.join(5)
    finally:
        for c in queued:
            c.close()
        server.close()


def test_a_pipelined_or_batched_initiate_holds_a_slot_too(fake: FakeCharon, one_slot: None) -> None:
    from app.adapters.vici.commands import initiate_command, list_sas_command

    fake.script("initiate", Reply({"success": "yes"}))
    gateway = ViciGateway(fake.socket_path, timeout=2.0)
    with gateway.pipeline() as charon:
        charon.send([list_sas_command()])
        assert _free(fake)  # no control command yet
        charon.send([initiate_command(child="c", ike="c", timeout_ms=1000)])
        assert not _free(fake)  # held from the initiate until the pipeline closes
        charon.finish()
        assert not _free(fake)
    assert _free(fake)
    gateway.batch([initiate_command(child="c", ike="c", timeout_ms=1000)])
    assert _free(fake)


def _free(fake: FakeCharon) -> bool:
    release = CONTROL_SLOTS.take(str(fake.socket_path), 0)
    if release is None:
        return False
    release()
    return True
