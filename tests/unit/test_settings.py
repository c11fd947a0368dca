"""Settings that depend on each other (the write slots stay below the worker threads), their
sections, and their documentation: every ``QOSS_*`` variable has its row in
docs/configuration.md, under its section's heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from app.settings import OidcSettings, Settings

_CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


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


def _documented() -> dict[str, list[str]]:
    """Each ``## `` heading of docs/configuration.md and the settings its table's rows name."""
    rows: dict[str, list[str]] = {}
    heading = ""
    for line in _CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            rows[heading] = []
        elif match := re.match(r"\| `QOSS_([A-Z0-9_]+)` \|", line):
            rows[heading].append(match.group(1).lower())
    return rows


def test_every_setting_is_documented_once_under_its_sections_heading() -> None:
    documented = _documented()
    sections = [base for base in Settings.__bases__ if issubclass(base, BaseSettings)]
    titles = [section.__doc__.split(":")[0] for section in sections if section.__doc__]
    assert len(titles) == len(sections)
    assert [h for h in documented if h in titles] == titles  # the code's sections, in its order
    for title, section in zip(titles, sections, strict=True):
        assert sorted(documented[title]) == sorted(section.model_fields), title
    assert sorted(n for t in titles for n in documented[t]) == sorted(Settings.model_fields)


def test_a_section_alone_reads_the_same_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QOSS_OIDC_TIMEOUT", "7")
    monkeypatch.setenv("QOSS_PORT", "9123")
    assert OidcSettings(_env_file=None).oidc_timeout == 7
    settings = Settings(_env_file=None)
    assert (settings.oidc_timeout, settings.port) == (7, 9123)
    assert isinstance(settings, OidcSettings)
