"""The device CA's directory: its files opened relative to the open directory, without following
links, and written whole.

A file anyone else may write to (or, for a key, read) is refused, never used or repaired:
:class:`DeviceCAError` says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CaFile", "DeviceCAError", "create_file", "open_directory", "read_file", "replace_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class DeviceCAError(ValueError):
    """A file of the CA's directory cannot be used: a link, not a regular file, not the
    service's own, open to other users, a key that does not match its certificate, or the
    CA of another owner. Never repaired by qoss: the message says what to do."""


@dataclass(frozen=True, slots=True)
class CaFile:
    """A file's content and when it was last written."""

    data: bytes
    mtime: float


@contextlib.contextmanager
def open_directory(directory: Path) -> Iterator[int]:
    """The CA's directory, open (made 0700 if missing); a link, or one others may write to, refused."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DeviceCAError(f"the CA directory {directory} is a link or not a directory: name the directory "
                                "itself") from exc
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise DeviceCAError(f"the CA directory {directory} is owned by uid {st.st_uid}, not by the service's "
                                f"user ({os.geteuid()})")
        if st.st_mode & 0o022:
            raise DeviceCAError(f"the CA directory {directory} is writable by other users "
                                f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 700 it")
        yield fd
    finally:
        os.close(fd)


def read_file(dfd: int, directory: Path, name: str, *, secret: bool) -> CaFile | None:
    """A file of the directory, or None if it does not exist.

    Raises:
        DeviceCAError: a link, not a regular file, not the service's own, writable by others,
            or (``secret``) readable by others.
    """
    path = directory / name
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DeviceCAError(f"{path} is a symbolic link: refused (put the file itself there)") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DeviceCAError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise DeviceCAError(f"{path} is owned by uid {st.st_uid}, not by the service's user ({os.geteuid()})")
        if st.st_mode & (0o077 if secret else 0o022):
            who = "read or written by other users" if secret else "written by other users"
            fix = "chmod 600 it" if secret else "chmod 644 it"
            raise DeviceCAError(f"{path} may be {who} (mode {stat.S_IMODE(st.st_mode):o}): {fix}")
        return CaFile(handle.read(), st.st_mtime)


def _write_whole(fd: int, data: bytes, mode: int) -> None:
    """Give the open file ``mode``, write ``data`` and sync it; closes ``fd``."""
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def create_file(dfd: int, name: str, data: bytes, *, mode: int) -> bool:
    """Write a new file whole, unless it exists already (then False and nothing written)."""
    try:
        fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=dfd)
    except FileExistsError:
        return False
    try:
        _write_whole(fd, data, mode)
        os.fsync(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise
    return True


def replace_file(dfd: int, name: str, data: bytes, *, mode: int) -> None:
    """Write a file whole: a temporary file in the directory, renamed over ``name``."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=dfd)
    try:
        _write_whole(fd, data, mode)
        os.replace(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
