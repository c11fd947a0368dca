"""benchmarks/peered_setup.py end to end at a tiny size: two peered qoss services on one lab,
local and peered set-ups taking turns, then a few of each at once (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_peered_setup_prints_both_medians_and_brings_every_tunnel_up() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.peered_setup", "--rounds", "2", "--many", "4",
                           "--concurrency", "2"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"local [\d.]+ ms, peered [\d.]+ ms; peered / local = [\d.]+", done.stdout), done.stdout
    for kind in ("local", "peered"):
        assert re.search(rf"^4 {kind} tunnels at 2 clients: 4 up, 0 failed;", done.stdout, re.MULTILINE), done.stdout
