"""Loads that end by themselves: what a responder loads for a peer is unloaded at its deadline
unless released, even if the qoss process that loaded it is killed outright; what is loaded for
a move of a running tunnel is replaced by the conn it replaced (the tunnel goes on as before).

The process writes one small file per pending load (the charon's socket, the conn's name, the
deadline) into a directory of its own before it loads, and removes it when the initiator
confirms (or the tunnel is taken down). A janitor process, started detached (its own session)
beside ``qoss serve``, reads the directory every half second and, for each file past its
deadline, asks that charon to terminate and unload the conn and its secrets (or, for a move, to
load the old conn back), then removes the file. It outlives the server: killed, the server
leaves the janitor to finish what it had pending; the janitor ends once its server is gone and
nothing is pending.

    python -m app.adapters.pending_loads DIRECTORY SERVER_PID
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.domain.tunnels import ppk_secret_name

__all__ = ["PendingLoads", "sweep"]

#: Seconds between two looks at the directory.
_EVERY = 0.5


class PendingLoads:
    """The files of pending loads in ``directory`` (made 0700), and the janitor that ends them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._janitor: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Make the directory and start the janitor (detached: it survives this process)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self._janitor = subprocess.Popen(
            [sys.executable, "-m", "app.adapters.pending_loads", str(self.directory), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def hold(self, *, socket_path: str, conn: str, until: float, restore: Mapping[str, Any] | None = None) -> None:
        """Before loading ``conn`` into the charon at ``socket_path``: end it at ``until`` (epoch
        seconds) unless released. With ``restore`` (the ``load-conn`` settings it replaces, no
        secret in them), load those back at ``until`` instead: its running SAs stay."""
        path = self.directory / f"{conn}.json"
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        entry: dict[str, Any] = {"socket": socket_path, "conn": conn, "until": until}
        if restore is not None:
            entry["restore"] = dict(restore)
        with os.fdopen(fd, "w") as out:
            json.dump(entry, out)
        os.replace(temporary, path)

    def release(self, conn: str) -> None:
        """``conn`` is confirmed (or already taken down): nothing to end."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{conn}.json").unlink()

    def stop(self) -> None:
        """This process stops: the janitor stays only while something is pending."""
        self._janitor = None


def sweep(directory: Path, now: float | None = None) -> int:
    """End every pending load in ``directory`` past its deadline; how many."""
    clock = time.time() if now is None else now
    ended = 0
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            socket_path, conn, until = str(entry["socket"]), str(entry["conn"]), float(entry["until"])
            restore = entry.get("restore")
            if restore is not None and not isinstance(restore, dict):
                raise TypeError("restore is a conn's settings")
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if until > clock:
            continue
        try:
            if restore is not None:
                _restore(socket_path, conn, restore)
            else:
                _unload(socket_path, conn)
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # no charon listens there: a charon that stopped took its loaded conns with it
        except OSError:
            continue  # the charon does not answer now: try again at the next look
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        ended += 1
    return ended


def _unload(socket_path: str, conn: str) -> None:
    import vici  # the janitor alone needs it here

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(socket_path)
        session = vici.Session(sock)
        for command, args in ((session.terminate, {"ike": conn, "timeout": 2000, "force": "yes"}),
                              (session.unload_conn, {"name": conn}), (session.unload_shared, {"id": conn}),
                              (session.unload_shared, {"id": ppk_secret_name(conn)})):
            try:
                result = command(args)
                if hasattr(result, "__iter__") and not isinstance(result, (dict, bytes)):
                    for _ in result:  # a streamed command's log
                        pass
            except vici.exception.CommandException:
                pass  # nothing of that name: already gone
    finally:
        sock.close()


def _restore(socket_path: str, conn: str, settings: dict[str, Any]) -> None:
    import vici

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(socket_path)
        with contextlib.suppress(vici.exception.CommandException):  # refused: nothing better to do than leave it
            vici.Session(sock).load_conn({conn: settings})
    finally:
        sock.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    directory, server = Path(argv[0]), int(argv[1])
    while True:
        sweep(directory)
        if not _alive(server) and not any(directory.glob("*.json")):
            return 0
        time.sleep(_EVERY)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
