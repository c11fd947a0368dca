"""benchmarks/capacity_rate.py end to end at a tiny size: it completes, prints a ratio per
concurrency with no failed tunnel, and leaves no namespace behind (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.charon

ROOT = Path(__file__).resolve().parents[2]
#: clients | qoss tunnels/s | charon initiate/s | ratio | ... | failed qoss/charon | ...
ROW = re.compile(r"^\s+(\d+) \|\s+([\d.]+) \|\s+([\d.]+) \|\s+([\d.]+) \|.*\|\s+(\d+)/(\d+)", re.MULTILINE)


@pytest.mark.parametrize("client", ["lean", "httpx"])
def test_capacity_rate_at_four_tunnels_prints_a_ratio_per_concurrency_and_cleans_up(client: str) -> None:
    done = subprocess.Popen([sys.executable, "-m", "benchmarks.capacity_rate", "--tunnels", "4", "--concurrency",
                             "1,2", "--rounds", "1", "--budget", "60", "--settle", "0", "--client", client], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err[-3000:]
    rows = {int(m[0]): m for m in ROW.findall(out)}
    assert set(rows) == {1, 2}, out
    for _, qoss, charon, ratio, failed_qoss, failed_charon in rows.values():
        assert float(qoss) > 0, out
        assert float(charon) > 0, out
        assert float(ratio) == pytest.approx(float(qoss) / float(charon), rel=0.05, abs=0.01)
        assert (failed_qoss, failed_charon) == ("0", "0"), out
    assert f"qoss's client {client};" in out, out
    assert re.search(r"qoss arm qoss [\d.]+ left [\d.]+ right [\d.]+ client [\d.]+", out), out
    share = r"(\d+%|n/a \(too short\))"  # a timed phase of a few ms may span no clock tick
    busy = re.search(rf"cores busy in the timed phase \(share of their time\): 1 clients: qoss arm {share}, "
                     rf"charon arm {share}; 2 clients: qoss arm {share}, charon arm {share}", out)
    assert busy, out
    assert all(s.startswith("n/a") or 0 <= int(s[:-1]) <= 100 for s in busy.groups()), out
    assert re.search(r"worst ratio qoss / charon load\+init: \d+\.\d+ \(goal >= 0\.6\) (OK|MISSED)", out), out
    prefix = f"qb{done.pid % 10000}-"
    assert not [n.name for n in Path("/run/netns").iterdir() if n.name.startswith(prefix)]
