"""What the client's own charon can do: the algorithm keywords it offers and whether it can do
AH and transport mode (not with kernel-libipsec), read with VICI ``get-algorithms`` and
``stats``. A request declares them to Target, so they are read once and cached, in memory and in
``state_dir/capabilities.json`` (for the next ``qoss agent connect``), keyed on the running
charon: a restarted charon (the only way to change its plugins, hence its algorithms and back
end) is read again, and so is one read more than :data:`CAPABILITIES_TTL` seconds ago."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from app.domain.charon_port import ViciPort
from app.domain.tunnels import keywords_from_charon
from app.services.agent.client_state import CAPABILITIES_FILE, write_private

__all__ = ["CAPABILITIES_TTL", "CharonCapabilities"]

#: What a capabilities file holds: 2 counts a PPK from charon's version (a file of 1 is read again).
_CAPS_FORMAT = 2
#: Cached charon capabilities are read again after this many seconds (and whenever charon restarts).
CAPABILITIES_TTL = 3600.0


class CharonCapabilities:
    """The capabilities of the charon behind ``vici`` (its VICI socket at ``socket``), cached in
    ``state_dir``."""

    def __init__(self, *, vici: ViciPort, socket: str, state_dir: Path, clock: Callable[[], float]) -> None:
        self._vici = vici
        self._socket = socket
        self._state_dir = state_dir
        self._clock = clock
        self._caps: tuple[list[int], float, tuple[str, ...], bool] | None = None

    def _charon_key(self) -> list[int] | None:
        """What identifies the running charon: its VICI socket's device, inode and change time.

        charon makes a new socket each time it starts, so a restart (the only way to change
        its plugins, hence its algorithms and back end) changes the key. None: no socket.
        """
        try:
            info = os.stat(self._socket)
        except OSError:
            return None
        return [info.st_dev, info.st_ino, info.st_ctime_ns]

    def _caps_path(self) -> Path:
        return self._state_dir / CAPABILITIES_FILE

    def _cached(self, key: list[int]) -> tuple[tuple[str, ...], bool] | None:
        now = self._clock()
        if self._caps is not None and self._caps[0] == key and now - self._caps[1] < CAPABILITIES_TTL:
            return self._caps[2], self._caps[3]
        try:
            raw = json.loads(self._caps_path().read_text())
            if (raw.get("format") == _CAPS_FORMAT and raw["key"] == key
                    and 0 <= now - float(raw["at"]) < CAPABILITIES_TTL
                    and isinstance(raw["native"], bool) and isinstance(raw["algorithms"], list)
                    and all(isinstance(a, str) for a in raw["algorithms"])):
                self._caps = (key, float(raw["at"]), tuple(raw["algorithms"]), raw["native"])
                return self._caps[2], self._caps[3]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def read(self, *, refresh: bool = False) -> tuple[tuple[str, ...], bool]:
        """(algorithm keywords of the charon, whether it can do AH and transport mode), from the
        cache unless the charon restarted, the cache is older than :data:`CAPABILITIES_TTL`, or
        ``refresh`` is true."""
        key = self._charon_key()
        if key is not None and not refresh:
            cached = self._cached(key)
            if cached is not None:
                return cached
        algorithms = tuple(sorted(keywords_from_charon(self._vici.get_algorithms().as_sections(),
                                                       version=self._vici.version().version)))
        native = self._vici.stats().backend != "kernel-libipsec"
        if key is not None and key == self._charon_key():
            now = self._clock()
            self._caps = (key, now, algorithms, native)
            with contextlib.suppress(OSError):
                self._state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_private(self._caps_path(), json.dumps(
                    {"format": _CAPS_FORMAT, "key": key, "at": now, "algorithms": list(algorithms), "native": native}))
        return algorithms, native
