"""The server's CPU by thread: py-spy's thread names joined to /proc's per-thread times."""

from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks._harness import thread_cpu_seconds
from benchmarks.profile_server import by_thread, thread_names

DUMP = '''Process 4242: /work/.venv/bin/python -m app serve
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 4242 (idle): "MainThread"
    select (selectors.py:468)
Thread 4250 (active): "AnyIO worker thread"
    execute (app/adapters/db/hot.py:148)
Thread 0x10a5 (idle): "AnyIO worker thread"
    wait (threading.py:327)
Thread 4260 (idle+gil): "vici-events:/run/left/charon.vici"
    recv_into (app/adapters/vici/wire.py:124)
'''


def test_thread_names_reads_every_thread_line_of_a_dump() -> None:
    assert thread_names(DUMP) == {4242: "MainThread", 4250: "AnyIO worker thread", 0x10A5: "AnyIO worker thread",
                                  4260: "vici-events:/run/left/charon.vici"}


def test_by_thread_sums_a_pool_under_its_name_and_leaves_out_idle_threads() -> None:
    names = thread_names(DUMP)
    before = {4242: 1.0, 4250: 2.0, 0x10A5: 0.5, 4260: 0.1, 99: 3.0}
    after = {4242: 1.25, 4250: 2.5, 0x10A5: 0.75, 4260: 0.1, 99: 3.5, 100: 0.2}
    assert by_thread(before, after, names) == pytest.approx(
        {"MainThread": 0.25, "AnyIO worker thread": 0.75, "thread 99": 0.5, "thread 100": 0.2})


def test_thread_cpu_seconds_counts_the_cpu_of_a_busy_thread_of_this_process() -> None:
    ids: list[int] = []
    stop = threading.Event()

    def spin() -> None:
        ids.append(threading.get_native_id())
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin)
    t.start()
    try:
        while not ids:
            time.sleep(0.001)
        first = thread_cpu_seconds(os.getpid())
        time.sleep(0.2)
        second = thread_cpu_seconds(os.getpid())
    finally:
        stop.set()
        t.join()
    assert ids[0] in first
    assert second[ids[0]] > first[ids[0]]
    assert threading.get_native_id() in first
