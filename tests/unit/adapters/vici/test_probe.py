"""A registration's probe of a socket: one deadline for the whole exchange and VICI's limit on a
message's size, whatever the other end sends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from app.adapters.vici.probe import prober
from app.domain.errors import GatewayUnreachable
from tests.fakes import FakeCharon
from tests.fakes.not_a_charon import Behaviour, NotACharon


def _version_error(path: str, timeout: float) -> BaseException | None:
    """What ``version`` on ``path`` raised, asked in a thread given 10 s to finish (None: it answered)."""
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            prober(timeout)(path).version()
            outcome.append(None)
        except BaseException as exc:  # handed to the test to judge
            outcome.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "the probe did not end"
    return outcome[0]


@pytest.mark.parametrize("behaviour", ["half", "silent"])
def test_a_reply_that_stops_or_never_starts_ends_at_the_deadline(socket_dir: Path, behaviour: Behaviour) -> None:
    """Not when the other end lets go (``hold``): vici's own reading waits without a timeout
    once a reply's first byte has come."""
    with NotACharon(socket_dir / "odd.vici", behaviour, hold=8.0) as odd:
        error = _version_error(odd.path, 0.5)
    assert isinstance(error, GatewayUnreachable), error
    assert error.message.endswith("no answer within 0.5 s")


@pytest.mark.parametrize("behaviour", ["garbage", "reset"])
def test_a_socket_that_answers_no_vici_fails_the_probe(socket_dir: Path, behaviour: Behaviour) -> None:
    with NotACharon(socket_dir / "odd.vici", behaviour, hold=8.0) as odd:
        error = _version_error(odd.path, 2.0)
    assert isinstance(error, GatewayUnreachable), error


def test_a_reply_announced_larger_than_vici_allows_is_not_read(socket_dir: Path) -> None:
    with NotACharon(socket_dir / "odd.vici", "huge", hold=8.0) as odd:
        error = _version_error(odd.path, 5.0)
    assert isinstance(error, GatewayUnreachable)
    assert "4294967295 bytes announced" in error.message


def test_a_charon_answers_the_probe(fake: FakeCharon) -> None:
    probe = prober(2.0)(fake.socket_path)
    assert (probe.version().daemon, probe.stats().backend) == ("charon", "kernel-libipsec")


def test_the_deadline_is_the_whole_probes_not_each_commands(fake: FakeCharon) -> None:
    probe = prober(0.2)
    time.sleep(0.3)
    with pytest.raises(GatewayUnreachable):
        probe(fake.socket_path).version()
    assert fake.calls == []  # not even connected
