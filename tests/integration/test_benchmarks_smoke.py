"""Every benchmark in benchmarks/ runs to its end at a tiny size: it builds its lab and server,
does its work, prints its comparison and leaves no namespace behind. Nothing about the figures is
asserted (this machine is shared while the suite runs): a benchmark that cannot run is what
fails. The larger smoke runs (capacity_rate, negotiation, slow_clients) have modules of their
own; choice_quality, whose smallest run measures every feasible suite through a real tunnel (a
minute here), runs by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.charon

ROOT = Path(__file__).resolve().parents[2]

#: benchmark -> its arguments at a tiny size (its waits for the server to settle cut short: the
#: figures are not read), and a line its report always prints.
SMALL = {
    "tunnel_setup": (["--rounds", "2"], "x the local set-up, leaving"),  # a local and a peered set-up, the floors
    "agent_join": (["-n", "20"], "bare:"),
    "capacity_agent": (["--joins", "4", "--concurrency", "2", "--budget", "60"], "joined 4,"),
    "rekey_scale": (["--tunnels", "2", "--sample", "1", "--budget", "60", "--settle", "0.2"], "dry run:"),
    "console_pages": (["--rounds", "2"], "slowest p95"),
    "monitor_resync": (["--tunnels", "4", "--rounds", "1", "--budget", "60", "--settle", "0"],
                       "per tunnel / all at once"),
    "tunnel_scale": (["--tunnels", "4", "--cycles", "1", "--budget", "60"], "tunnels up (listed"),
    "profile_server": (["--tunnels", "4", "--clients", "2"], "top 10 by their own time"),
    "capacity_many": (["--tunnels", "4", "--quiet", "1", "--budget", "60", "--settle", "0"], "0 records left"),
    "overload": (["--bursts", "20", "--quiet", "1", "--arm", "on", "--settle", "0"], "| on | 20 |"),
    "tunnel_reads": (["--tunnels", "20", "--rounds", "1"], "the check's one statement"),
}

#: What a benchmark's server is given besides: the memory release after 1 s without a request,
#: so that capacity_many's last quiet interval (at least that long) stays short.
ENV = {"QOSS_MEMORY_RELEASE_AFTER": "1"}


def _namespaces() -> list[str]:
    return os.listdir("/run/netns") if Path("/run/netns").exists() else []


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_benchmark_runs_to_its_end_and_cleans_up(name: str) -> None:
    args, printed = SMALL[name]
    run = subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV})
    try:
        out, err = run.communicate(timeout=240)
    finally:
        run.kill()
    assert run.returncode == 0, (out + err)[-3000:]
    assert printed in out, out[-2000:]
    # Its labs are named after its pid (``qb<pid % 10000>-``, ``<hint><pid % 100000>-``): none is left.
    assert not [n for n in _namespaces() if f"{run.pid % 10000}-" in n]


def test_two_overload_arms_of_one_name_are_refused_before_any_server_starts() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.overload", "--arm", "on", "--arm", "on"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "each --arm needs a name of its own" in done.stderr
    assert "qoss serve" not in done.stdout
