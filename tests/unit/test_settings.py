"""Settings that depend on each other: the write slots stay below the worker threads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings


def test_write_slots_default_to_half_of_the_worker_threads() -> None:
    assert Settings(worker_threads=40).writes_in_flight == 20
    assert Settings(worker_threads=3).writes_in_flight == 1
    assert Settings(worker_threads=2).writes_in_flight == 1
    assert Settings(worker_threads=40, max_writes_in_flight=39).writes_in_flight == 39


def test_as_many_write_slots_as_worker_threads_is_refused() -> None:
    with pytest.raises(ValidationError, match="must be below worker_threads"):
        Settings(worker_threads=8, max_writes_in_flight=8)


def test_one_worker_thread_is_refused() -> None:
    with pytest.raises(ValidationError, match="worker_threads"):
        Settings(worker_threads=1)


def test_memory_release_reads_a_comma_separated_list_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().memory_release == ["threads", "pool", "trim"]
    monkeypatch.setenv("QOSS_MEMORY_RELEASE", "pool, trim")
    assert Settings().memory_release == ["pool", "trim"]
    monkeypatch.setenv("QOSS_MEMORY_RELEASE", "off")
    assert Settings().memory_release == []
    monkeypatch.setenv("QOSS_MEMORY_RELEASE", "")
    assert Settings().memory_release == []
    monkeypatch.setenv("QOSS_MEMORY_RELEASE", "heap")
    with pytest.raises(ValidationError, match="memory_release"):
        Settings()
