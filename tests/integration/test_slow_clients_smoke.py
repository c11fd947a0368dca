"""benchmarks/slow_clients.py end to end at a tiny size: it raises its open-file limit, serves,
and prints a row per hostile kind, and one with none, with ordinary requests answered (no timing
is asserted); the same behind HAProxy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: | kind | sockets | answered 200 | not answered | p50 | p99 | against none | opened / closed | RSS |
ROW = re.compile(r"^\| ([a-z-]+) \| ([\d,]+) \| (\d+) \| (\d+) \| [\d.]+ ms \| [\d.]+ ms \| [^|]+ \| [\d,]+ / [\d,]+ "
                 r"\| \d+ MB \|$", re.MULTILINE)


@pytest.mark.parametrize("front", ["qoss", "haproxy"])
def test_slow_clients_at_five_sockets_prints_a_row_per_kind_with_requests_answered(front: str) -> None:
    kinds = ["drip", "blank", "big-later-head", "never-read", "half-closed", "pipelined-probe"]
    done = subprocess.run([sys.executable, "-m", "benchmarks.slow_clients", "--sockets", "5", "--seconds", "1",
                           "--clients", "2", "--kinds", ",".join(kinds), "--front", front],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {m[0]: m for m in ROW.findall(done.stdout)}
    assert set(rows) == {"none", *kinds}, done.stdout
    for _, _, answered, _ in rows.values():
        assert int(answered) > 0, done.stdout
    assert "open-file limit" in done.stdout
    assert ("behind HAProxy" in done.stdout) is (front == "haproxy")
