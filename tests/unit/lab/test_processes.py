"""A lab's record of what it started, and stopping what it started: the record is indented JSON,
0600 in a 0700 directory, read back as it was written (anything else reads as empty); stopping
ends and reaps every process started and forgets them."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.lab.processes import LabRecord, running, stop_started


def test_a_record_is_indented_json_for_its_owner_alone_and_updated_key_by_key(tmp_path: Path) -> None:
    record = LabRecord(tmp_path / "state" / "agent.json")
    assert record.load() == {}
    record.save({"prefix": "qa1", "servers": {}})
    record.update(servers={"host": {"pid": 7}}, users=["alice"])
    assert record.load() == {"prefix": "qa1", "servers": {"host": {"pid": 7}}, "users": ["alice"]}
    assert record.path.read_text() == json.dumps(record.load(), indent=2)
    assert stat.S_IMODE(record.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.path.parent.stat().st_mode) == 0o700
    assert [p.name for p in record.path.parent.iterdir()] == ["agent.json"]  # no temporary file left


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "null"])
def test_a_record_that_is_not_a_json_object_reads_as_empty(tmp_path: Path, text: str) -> None:
    (tmp_path / "peers.json").write_text(text)
    assert LabRecord(tmp_path / "peers.json").load() == {}


def test_stopping_what_was_started_ends_and_reaps_it_and_forgets_it() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    started = {"server": sleeper, "relay": done}
    try:
        stop_started(started, [], grace=5.0)
        assert started == {}
        assert sleeper.returncode is not None  # reaped: ended by the signal
        assert not running(sleeper.pid)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(timeout=10)
