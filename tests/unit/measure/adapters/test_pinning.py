"""The tunnel benchmark's CPU pinning: CPU lists, and pin/restore on a real process with threads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.measure.adapters.pinning import check_cpus, parse_cpus, pin_threads

ALLOWED = frozenset(os.sched_getaffinity(0))
#: Three sleeping threads; one more once a line arrives on stdin.
CHILD = ("import sys, threading, time\n"
         "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
         "sys.stdin.readline()\n"
         "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
         "time.sleep(30)\n")

needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two usable CPUs to tell pinned from not")


def _cpu_list(text: str) -> frozenset[int]:
    """``0-1,3`` as {0, 1, 3} (the kernel's Cpus_allowed_list)."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def _affinities(pid: int) -> dict[int, frozenset[int]]:
    """Per thread of ``pid``: Cpus_allowed_list from /proc/PID/task/TID/status."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(task.name)] = _cpu_list(line.split(":", 1)[1].strip())
    return out


def _wait_threads(pid: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(list(Path(f"/proc/{pid}/task").iterdir())) < count:
        assert time.monotonic() < deadline, f"process {pid} did not start {count} threads"
        time.sleep(0.01)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A Python process with four threads (main + 3), a fifth after a line on its stdin."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, text=True)
    try:
        _wait_threads(proc.pid, 4)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=5)
        if proc.stdin is not None:
            proc.stdin.close()


@pytest.mark.parametrize(("text", "cpus"), [("0", {0}), (" 0 ", {0}), ("0,0", {0})])
def test_a_cpu_list_is_a_set_of_usable_cpus(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus


def test_every_usable_cpu_may_be_named() -> None:
    assert parse_cpus(",".join(str(c) for c in sorted(ALLOWED))) == ALLOWED


@pytest.mark.parametrize("text", ["", "one", "0-1", "-1", "0,,1", "0;1", "1.0"])
def test_what_is_not_a_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="comma-separated CPU numbers"):
        parse_cpus(text)


def test_a_cpu_this_process_may_not_use_is_refused_naming_the_allowed_ones() -> None:
    allowed = ",".join(str(c) for c in sorted(ALLOWED))
    with pytest.raises(ValueError, match=f"CPU 4096 not usable; this process may use CPUs {allowed}$"):
        parse_cpus("0,4096")
    with pytest.raises(ValueError, match=f"empty; this process may use CPUs {allowed}$"):
        check_cpus(())


@pytest.mark.parametrize(("cpus", "says"), [("4096", "CPU 4096 not usable"), ("x", "comma-separated")])
def test_the_command_refuses_a_bad_cpu_list_before_any_lab(cpus: str, says: str) -> None:
    result = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128gcm16", "--cpus", cpus])
    assert result.exit_code == 2
    assert says in result.output


@needs_two_cpus
def test_every_thread_is_pinned_and_gets_its_own_affinity_back(child: subprocess.Popen[str]) -> None:
    cpu = max(ALLOWED)
    other = min(ALLOWED)
    before = _affinities(child.pid)
    assert all(a == ALLOWED for a in before.values())
    odd = max(before)  # one thread with an affinity of its own, which it must get back
    os.sched_setaffinity(odd, {other})
    with pin_threads(frozenset({cpu}), lambda: [child.pid]) as pins:
        assert pins.pinned == 4
        assert set(_affinities(child.pid).values()) == {frozenset({cpu})}
        # A thread started now (it inherits the pinned set) is taken along by the next pin().
        assert child.stdin is not None
        child.stdin.write("more\n")
        child.stdin.flush()
        _wait_threads(child.pid, 5)
        assert pins.pin() == 5
        during = _affinities(child.pid)
        assert set(during.values()) == {frozenset({cpu})}
        late = (set(during) - set(before)).pop()
    after = _affinities(child.pid)
    assert after == {**before, odd: frozenset({other}), late: ALLOWED}  # the late one: its process's original


@needs_two_cpus
def test_affinities_are_restored_when_the_run_fails(child: subprocess.Popen[str]) -> None:
    before = _affinities(child.pid)
    during = []

    def interrupted() -> None:
        with pin_threads(frozenset({max(ALLOWED)}), lambda: [child.pid]):
            during.append(set(_affinities(child.pid).values()))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert during == [{frozenset({max(ALLOWED)})}]
    assert _affinities(child.pid) == before


def test_a_process_that_is_gone_is_passed_over() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    with pin_threads(frozenset({min(ALLOWED)}), lambda: [proc.pid]) as pins:
        assert pins.pinned == 0
