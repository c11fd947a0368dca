"""The processes a lab starts: a command run to completion, whether a pid still runs (and is
still the process started, by its environment), every process marked by an environment
variable, and stopping them (SIGTERM, then SIGKILL). Reads ``/proc`` (root reads every
process's environment)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LabError", "processes_with_env", "run_command", "running", "running_with_env", "stop_processes"]


class LabError(RuntimeError):
    """The lab could not be built (the message says which step and why)."""


def run_command(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``args`` to completion (30 s at most), capturing its output.

    Raises:
        LabError: with ``check``, it exited non-zero (the message is its stderr).
    """
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (zombies count as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def running_with_env(pid: int, variable: str, value: str) -> bool:
    """Whether ``pid`` runs with ``variable=value`` in its environment: still the process
    that was started so, not a recycled pid."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{variable}={value}".encode() in environ and running(pid)


def processes_with_env(variable: str, under: Path, *, exact: bool = False) -> list[int]:
    """The running processes whose environment sets ``variable`` to a path under ``under``
    (or, with ``exact``, to ``under`` itself): how a lab finds every process it started,
    whatever its record says. Reads ``/proc/<pid>/environ`` (root reads every process's).
    """
    base = str(Path(under))
    wanted = f"{variable}={base}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        matches = any(v == wanted or (not exact and v.startswith(wanted + b"/")) for v in environ)
        if matches and running(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_processes(pids: Sequence[int], grace: float = 3.0, *, group: bool = False) -> None:
    """SIGTERM each process (its process group with ``group``), SIGKILL what still runs after ``grace`` s."""
    kill = os.killpg if group else os.kill
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(running(pid) for pid in pids):
        time.sleep(0.02)
    for pid in pids:
        if running(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)

