"""benchmarks/negotiation.py end to end at a tiny size: both halves run to the end and print
their figures (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_negotiation_benchmark_runs_both_halves_to_the_end() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.negotiation", "--decisions", "50", "--requests", "450",
                           "--concurrency", "4", "--warmup", "20"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^in-process negotiate, 3 peers, full catalogue: n=50 p50=[\d.]+ ms", done.stdout,
                     re.M), done.stdout
    assert re.search(r"^HTTP under uvicorn, concurrency 4: POST /v1/negotiations \d+ req/s, GET /livez \d+ req/s, "
                     r"ratio [\d.]+", done.stdout, re.M), done.stdout
