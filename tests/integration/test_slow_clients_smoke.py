"""benchmarks/slow_clients.py end to end at a tiny size: it raises its open-file limit, serves,
and prints a row per count of slow sockets with requests answered (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: | slow sockets | answered 200 | not answered | p50 | p99 | closed by the server |
ROW = re.compile(r"^\| ([\d,]+) \| (\d+) \| (\d+) \| [\d.]+ ms \| [\d.]+ ms \| (\d+) \|$", re.MULTILINE)


def test_slow_clients_at_twenty_sockets_prints_a_row_per_count_with_requests_answered() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.slow_clients", "--sockets", "0,20", "--seconds", "1",
                           "--clients", "2"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {m[0]: m for m in ROW.findall(done.stdout)}
    assert set(rows) == {"0", "20"}, done.stdout
    for _, answered, _, _ in rows.values():
        assert int(answered) > 0, done.stdout
    assert "open-file limit" in done.stdout
