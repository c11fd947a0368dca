"""The audit chain's key and checkpoints, kept outside the database.

- The key: 32 random bytes in ``audit/chain.key`` of the service's own directory
  (:class:`~app.adapters.state_dir.StateDir`: 0600 in a 0700 folder, links refused), made the
  first time a writer finds the chain empty or unkeyed so far, never otherwise; or the file
  ``audit_key_file`` names (``QOSS_AUDIT_KEY_FILE``: a secret every replica shares), never made.
  Every process that writes one database's audit log needs the same key.
- The checkpoints: one line of JSON per checkpoint (:func:`app.domain.audit_chain.checkpoint_line`)
  appended to ``audit/checkpoints.jsonl`` and logged (logger ``qoss.audit``); ``qoss audit
  verify`` holds the chain against them.

Errors::

    AuditSealError
    ├── AuditKeyError (RuntimeError)   the key is missing where the chain needs one, or unusable
    └── BadCheckpoint (ValueError)     a checkpoint line that does not hold
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.adapters.state_dir import StateDir, UnsafeStateDir
from app.domain.audit_chain import KEY_BYTES, ChainKey, Checkpoint, checkpoint_line, read_checkpoint

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = ["AuditKeyError", "AuditSeal", "AuditSealError", "BadCheckpoint"]

log = logging.getLogger("qoss.audit")

_FOLDER = "audit"
_KEY = "chain.key"
_CHECKPOINTS = "checkpoints.jsonl"


class AuditSealError(Exception):
    """The audit chain's key or checkpoints cannot be used (see the module for the tree)."""


class AuditKeyError(AuditSealError, RuntimeError):
    """The audit key is missing where the chain needs one, unreadable, or too short."""


class BadCheckpoint(AuditSealError, ValueError):
    """A line of a checkpoints file is not a checkpoint this key wrote (altered, or another key's)."""


class AuditSeal:
    """Where one process keeps the audit key and writes checkpoints.

    Args:
        state_dir: the service's own directory.
        key_file: a key file of the operator's (shared by every replica) instead of the one in
            ``state_dir``; never made by qoss.
        checkpoint_every: a checkpoint each time an entry's id passes a multiple of this.
    """

    def __init__(self, state_dir: StateDir, *, key_file: Path | None = None, checkpoint_every: int = 100) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self.state_dir = state_dir
        self.key_file = key_file
        self.checkpoint_every = checkpoint_every

    @classmethod
    def from_settings(cls, settings: Settings) -> AuditSeal:
        """The seal the settings describe (``state_dir``, ``audit_key_file``, ``audit_checkpoint_every``)."""
        return cls(StateDir(settings.state_dir), key_file=settings.audit_key_file,
                   checkpoint_every=settings.audit_checkpoint_every)

    @property
    def key_location(self) -> str:
        """Where the key is looked for (for messages; never the key)."""
        return str(self.key_file or self.state_dir.path(_FOLDER, _KEY))

    @property
    def checkpoints_location(self) -> str:
        return str(self.state_dir.path(_FOLDER, _CHECKPOINTS))

    def read_key(self) -> ChainKey | None:
        """The audit key, or None if its file does not exist.

        Raises:
            AuditKeyError: the file is shorter than 32 bytes, or readable by other users.
            UnsafeStateDir: the file or a folder on the way is a link, or not the service's own.
        """
        try:
            secret = self._read_key_file() if self.key_file is not None else self.state_dir.read(_FOLDER, _KEY)
        except FileNotFoundError:
            return None
        try:
            return ChainKey.derive(secret)
        except ValueError as exc:
            raise AuditKeyError(f"the audit key at {self.key_location} is unusable: {exc}") from None

    def make_key(self) -> ChainKey:
        """The key in the state directory, made (32 random bytes, 0600) if there is none yet; a
        second process making one at the same moment gets the first one's.

        Raises:
            AuditKeyError: the key is the operator's file (``audit_key_file``), which qoss never makes.
        """
        if self.key_file is not None:
            raise AuditKeyError(f"QOSS_AUDIT_KEY_FILE names {self.key_file}, which does not exist: qoss never "
                                "makes that file; write 32 or more random bytes to it (the same on every replica)")
        self.state_dir.create(_FOLDER, _KEY, data=secrets.token_bytes(KEY_BYTES))  # or keep another process's
        log.warning("made a new audit key at %s: every replica writing this database needs this same file",
                    self.key_location)
        key = self.read_key()
        assert key is not None
        return key

    def _read_key_file(self) -> bytes:
        assert self.key_file is not None
        try:
            fd = os.open(self.key_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeStateDir(f"the audit key file {self.key_file} is a link: name the file itself") from exc
            raise
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeStateDir(f"the audit key file {self.key_file} is not a regular file")
            if st.st_uid not in (os.geteuid(), 0):
                raise UnsafeStateDir(f"the audit key file {self.key_file} is owned by uid {st.st_uid}, neither the "
                                     "service's user nor root")
            if st.st_mode & 0o026:
                raise UnsafeStateDir(f"the audit key file {self.key_file} is writable by other users or readable by "
                                     f"anyone (mode {stat.S_IMODE(st.st_mode):o})")
            return handle.read()

    def write_checkpoint(self, checkpoint: Checkpoint, key: ChainKey) -> None:
        """Append ``checkpoint`` to the checkpoints file (synced) and log it as one line."""
        line = checkpoint_line(checkpoint, key)
        self.state_dir.append(_FOLDER, _CHECKPOINTS, data=(line + "\n").encode("ascii"))
        log.info("audit checkpoint %s", line)

    def has_checkpoints(self) -> bool:
        """Whether the checkpoints file holds any line."""
        try:
            return bool(self.state_dir.read(_FOLDER, _CHECKPOINTS).strip())
        except FileNotFoundError:
            return False

    def read_checkpoints(self, key: ChainKey, *, more: Sequence[Path] = ()) -> list[Checkpoint]:
        """Every checkpoint in the checkpoints file (none if it does not exist) and in ``more``
        (other replicas' files, copied here).

        Raises:
            BadCheckpoint: a line is not a checkpoint this key wrote.
        """
        try:
            own = self.state_dir.read(_FOLDER, _CHECKPOINTS)
            texts = [(self.checkpoints_location, own.decode("ascii", "replace"))]
        except FileNotFoundError:
            texts = []
        texts += [(str(path), path.read_text(encoding="ascii", errors="replace")) for path in more]
        found: list[Checkpoint] = []
        for where, text in texts:
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    found.append(read_checkpoint(line, key))
                except ValueError as exc:
                    raise BadCheckpoint(f"{where} line {number}: {exc}") from None
        return found
