"""Giving memory back after a burst (app.adapters.memory): glibc found where it is, nothing
touched where it is not, and the release runs once a quiet spell with every part it is given."""

from __future__ import annotations

import asyncio
import platform
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from anyio._backends._asyncio import WorkerThread
from sqlalchemy import text

from app.adapters.db.engine import make_engine
from app.adapters.memory import Glibc, QuietRelease, c_library, glibc_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeGlibc:
    """Records what the release asks of glibc."""

    def __init__(self) -> None:
        self.trims: list[int] = []

    def glibc(self) -> Glibc:
        def trim(pad: int) -> int:
            self.trims.append(pad)
            return 1
        return Glibc(version="fake", malloc_trim=trim)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="this process's C library is not glibc")
def test_this_glibc_is_found_with_malloc_trim() -> None:
    libc = c_library()
    assert libc is not None
    assert libc.version == platform.libc_ver()[1]
    assert libc.malloc_trim(0) in (0, 1)


def test_a_c_library_without_gnu_get_libc_version_is_left_alone_as_on_musl() -> None:
    musl = SimpleNamespace(malloc=object(), free=object())  # musl: no gnu_get_libc_version, no malloc_trim
    assert glibc_of(musl) is None


def test_glibc_of_reads_the_version_and_keeps_malloc_trim() -> None:
    fake = FakeGlibc().glibc()
    libc = glibc_of(SimpleNamespace(gnu_get_libc_version=lambda: b"2.36", malloc_trim=fake.malloc_trim))
    assert libc is not None
    assert libc.version == "2.36"
    assert libc.malloc_trim is fake.malloc_trim


def _pooled(tmp_path: Path) -> tuple[object, int]:
    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}", writes=False, pool_size=4)
    connections = [engine.connect() for _ in range(3)]
    for c in connections:
        c.execute(text("select 1"))
    for c in connections:
        c.close()
    return engine, engine.pool.checkedin()  # type: ignore[attr-defined]


async def test_after_a_quiet_spell_the_pool_is_emptied_and_glibc_trimmed_once(tmp_path: Path) -> None:
    engine, kept = _pooled(tmp_path)
    assert kept == 3
    fake = FakeGlibc()
    release = QuietRelease(after=0.2, engines=[engine], libc=fake.glibc())  # type: ignore[list-item]
    stop = asyncio.Event()
    task = asyncio.create_task(release.run(stop))
    try:
        release.touch()
        await asyncio.sleep(0.1)
        assert release.releases == 0  # not yet quiet
        await _released(release, 1)  # due 0.2 s after the touch; a loaded machine runs its thread later
        assert release.releases == 1
        assert engine.pool.checkedin() == 0  # type: ignore[attr-defined]
        assert fake.trims == [0]
        await asyncio.sleep(0.5)
        assert release.releases == 1  # nothing came: nothing more to give back
        release.touch()
        await _released(release, 2)
        assert release.releases == 2
    finally:
        stop.set()
        await task
        engine.dispose()  # type: ignore[attr-defined]


async def _released(release: QuietRelease, count: int, within: float = 10.0) -> None:
    """Wait until ``release`` has run ``count`` times (at most ``within`` seconds, then go on: the
    caller's assertion says what was missing)."""
    deadline = time.monotonic() + within
    while release.releases < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def _running(release: QuietRelease, seconds: float, *, releases: int | None = None) -> None:
    """Run ``release`` for ``seconds`` (and, given ``releases``, on until it has run that many
    times, within :func:`_released`'s bound), then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(release.run(stop))
    await asyncio.sleep(seconds)
    if releases is not None:
        await _released(release, releases)
    stop.set()
    await task


async def test_nothing_is_released_before_the_first_request() -> None:
    fake = FakeGlibc()
    release = QuietRelease(after=0.1, libc=fake.glibc())
    await _running(release, 0.4)
    assert release.releases == 0
    assert fake.trims == []


async def test_without_trim_glibc_is_not_asked() -> None:
    fake = FakeGlibc()
    release = QuietRelease(after=0.1, trim=False, libc=fake.glibc())
    release.touch()
    await asyncio.sleep(0.15)
    await _running(release, 0.3, releases=1)
    assert release.releases == 1
    assert fake.trims == []


async def test_the_release_ends_worker_threads_idle_for_anyios_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The threads part of the release is anyio's own: a call into its worker threads ends those idle
    # for WorkerThread.MAX_IDLE_TIME (10 s). Shortened here; if anyio drops it, this fails.
    monkeypatch.setattr(WorkerThread, "MAX_IDLE_TIME", 0.2)
    gate = threading.Barrier(8)
    await asyncio.gather(*(anyio.to_thread.run_sync(gate.wait) for _ in range(8)))  # 8 threads at once
    workers = [t for t in threading.enumerate() if t.name == "AnyIO worker thread"]
    assert len(workers) >= 8
    time.sleep(0.3)  # they have all been idle past MAX_IDLE_TIME
    release = QuietRelease(after=0.1, libc=FakeGlibc().glibc())
    release.touch()
    await asyncio.sleep(0.15)
    await _running(release, 0.3, releases=1)
    for t in workers:
        t.join(timeout=2)
    assert sum(t.is_alive() for t in workers) <= 1  # the one that ran the release stays

