"""What the client keeps in its state directory (``state_dir``, 0700): a record per tunnel it
brought up (``<ticket>.json``: ticket, target, conn, suite, virtual IP, expiry; never the key),
a record per device it enrolled (``devices/<ticket>.json``), and the cache of its charon's
capabilities (:data:`CAPABILITIES_FILE`). Every file is the user's alone (0600) and replaced
whole, never written in place."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CAPABILITIES_FILE", "TunnelRecords", "has_ppk", "write_private"]

#: The file in ``state_dir`` that caches the charon's capabilities (not a tunnel's record).
CAPABILITIES_FILE = "capabilities.json"


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` (0600), replacing it atomically."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def has_ppk(record: Mapping[str, Any]) -> bool:
    """Whether a tunnel this client keeps has a post-quantum preshared key (its suite's mechanism)."""
    return (record.get("suite") or {}).get("post_quantum") == "ppk"


class TunnelRecords:
    """The records of the tunnels a client brought up and has not torn down, one file a ticket."""

    def __init__(self, state_dir: Path) -> None:
        self._dir = state_dir

    def _path(self, ticket: str) -> Path:
        return self._dir / f"{ticket}.json"

    def remember(self, report: Mapping[str, Any], objective_id: int) -> None:
        """Write (or rewrite) the record of the tunnel ``report`` describes."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(self._path(str(report["ticket"])), json.dumps({**report, "objective_id": objective_id},
                                                                    indent=2))

    def forget(self, ticket: str) -> None:
        """Remove a tunnel's record (none: nothing to do)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(ticket).unlink()

    def all(self) -> list[dict[str, Any]]:
        """Every tunnel's record, by ticket (an unreadable one is passed over)."""
        if not self._dir.is_dir():
            return []
        out = []
        for path in sorted(self._dir.glob("*.json")):
            if path.name == CAPABILITIES_FILE:
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        return out
