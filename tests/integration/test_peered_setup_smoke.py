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
    # The CPU each process used per set-up: site B works only for a peered one, and both charons for both.
    cpu = {kind: dict(re.findall(r"(site [AB]|charon \w+) ([\d.]+) ms", line))
           for kind, line in re.findall(r"^  CPU from request to 201, mean of 2 (\w+) set-ups: (.*)$", done.stdout,
                                        re.MULTILINE)}
    assert set(cpu) == {"local", "peered"}, done.stdout
    assert set(cpu["peered"]) == {"site A", "site B", "charon left", "charon right"}, done.stdout
    assert float(cpu["peered"]["site B"]) > 0.5, done.stdout
    assert all(float(cpu[kind][f"charon {end}"]) > 0.1 for kind in cpu for end in ("left", "right")), done.stdout
