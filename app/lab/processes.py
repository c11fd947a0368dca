"""The processes a lab starts: a command run to completion, whether a pid still runs (and is
still the process started, by its environment), every process marked by an environment
variable, and stopping them (SIGTERM, then SIGKILL). Reads ``/proc`` (root reads every
process's environment).

A lab's state is its owner's alone: its databases hold pending handoffs, its configs and logs
name keys and users. Every process a lab starts runs with :data:`PRIVATE_UMASK`, so what it
creates is 0600 (directories 0700); the lab's own files are written 0600
(:func:`write_private`, :func:`open_private_log`) in directories made 0700
(:func:`private_dir`), and what the lab writes through other code while it builds runs under
:func:`private_umask`. What a lab started is kept in its :class:`LabRecord`, so that another
process can find it and take it down."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["PRIVATE_UMASK", "LabError", "LabRecord", "open_private_log", "private_dir", "private_umask",
           "processes_with_env", "run_command", "running", "running_with_env", "stop_processes", "stop_started",
           "write_private"]

#: The umask of every process a lab starts: what they create is for their owner alone.
PRIVATE_UMASK = 0o077


class LabError(RuntimeError):
    """The lab could not be built (the message says which step and why)."""


def run_command(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``args`` to completion (30 s at most), capturing its output.

    Raises:
        LabError: with ``check``, it exited non-zero (the message is its stderr).
    """
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30, umask=PRIVATE_UMASK)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """This process's umask is :data:`PRIVATE_UMASK` for the block, then what it was."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter (made 0700, or made 0700 if it exists)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (a temporary file renamed over it), mode 0600."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    tmp.replace(path)


class LabRecord:
    """A lab's record of what it started: one JSON object in ``path`` (indented), written whole
    and 0600 in a directory only its owner may enter. A record that is missing, unreadable or not
    an object reads as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The record, or ``{}``."""
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def save(self, state: Mapping[str, Any]) -> None:
        """Write ``state`` as the whole record (its directory made 0700 first)."""
        private_dir(self.path.parent)
        write_private(self.path, json.dumps(state, indent=2))

    def update(self, **changes: Any) -> None:
        """The record with the top-level keys of ``changes`` set to their values."""
        self.save({**self.load(), **changes})


def open_private_log(path: Path) -> BinaryIO:
    """``path`` opened to append (made 0600; an older one made 0600 too), for a process's output."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


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


def stop_started(started: MutableMapping[str, subprocess.Popen[bytes]], victims: Iterable[int],
                 grace: float) -> None:
    """Stop ``victims`` and each process of ``started`` that still runs (:func:`stop_processes`),
    wait up to ``grace`` s for each of ``started`` to be reaped, and forget them (``started`` is
    emptied)."""
    pids = set(victims)
    pids.update(p.pid for p in started.values() if p.poll() is None)
    stop_processes(sorted(pids), grace)
    for proc in started.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    started.clear()
