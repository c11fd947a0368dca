"""The service's own directory: files qoss writes for itself (plot cache, audit key and
checkpoints), kept where no other local user can plant or swap one.

The directory is made 0700 and must be owned by the service's user, not a link, and not
writable by anyone else; every file below it is opened relative to an open directory with
``O_NOFOLLOW`` on each component, so a link planted anywhere on the way is refused, never
followed. A file is written to a temporary name in its folder and renamed into place, so a
reader sees the old content or the new one, never half of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["StateDir", "UnsafeStateDir"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeStateDir(PermissionError):
    """A directory or file under the state directory is a link, not the service's own, or open
    to other users: refused rather than used."""


def _check_owned(st: os.stat_result, what: str, *, directory: bool) -> None:
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise UnsafeStateDir(f"{what} is not a {'directory' if directory else 'regular file'}")
    if st.st_uid != os.geteuid():
        raise UnsafeStateDir(f"{what} is owned by uid {st.st_uid}, not by the service's user ({os.geteuid()})")
    if st.st_mode & 0o022:
        raise UnsafeStateDir(f"{what} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})")


class StateDir:
    """The service's own directory (``QOSS_STATE_DIR``, default ``./var``).

    Args:
        root: the directory; made (0700, with its parents) if missing.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def _open_root(self) -> int:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            st = os.fstat(fd)
            _check_owned(st, str(self.root), directory=True)
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def folder(self, *parts: str, create: bool = True) -> Iterator[int]:
        """An open descriptor of ``root/parts…``, each component entered without following links
        and checked (made 0700 where missing and ``create``).

        Raises:
            UnsafeStateDir: a component is a link, another user's, or writable by others.
            FileNotFoundError: a component is missing and ``create`` is false.
        """
        fd = self._open_root()
        try:
            for part in parts:
                _check_name(part)
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or not a folder
                        raise UnsafeStateDir(f"{part!r} is a link or not a folder") from exc
                    raise
                os.close(fd)
                fd = child
                _check_owned(os.fstat(fd), part, directory=True)
            yield fd
        finally:
            os.close(fd)

    def read(self, *parts: str) -> bytes:
        """The content of the file ``root/parts…``; the file must be the service's own regular file.

        Raises:
            FileNotFoundError: no such file.
            UnsafeStateDir: it or a folder on the way is a link or not the service's own.
        """
        *folders, name = parts
        _check_name(name)
        with self.folder(*folders, create=False) as dfd:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafeStateDir(f"{name!r} is a link") from exc
                raise
            with os.fdopen(fd, "rb") as handle:
                _check_owned(os.fstat(handle.fileno()), name, directory=False)
                return handle.read()

    def write(self, *parts: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to ``root/parts…`` whole (a temporary file renamed into place)."""
        self._put(parts, data, mode, replace=True)

    def create(self, *parts: str, data: bytes, mode: int = 0o600) -> bool:
        """Write ``data`` to ``root/parts…`` whole if no such file exists yet: one another process
        made meanwhile stays (a temporary file linked into place, never renamed over it).

        Returns:
            Whether this call made the file.
        """
        return self._put(parts, data, mode, replace=False)

    def _put(self, parts: tuple[str, ...], data: bytes, mode: int, *, replace: bool) -> bool:
        *folders, name = parts
        _check_name(name)
        with self.folder(*folders) as dfd:
            temp = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                if replace:
                    os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    return True
                try:
                    os.link(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except FileExistsError:
                    return False
                os.fsync(dfd)
                return True
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dfd)

    def append(self, *parts: str, data: bytes) -> None:
        """Append ``data`` to ``root/parts…`` (made 0600 if missing), synced before returning."""
        *folders, name = parts
        _check_name(name)
        with self.folder(*folders) as dfd:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            with os.fdopen(fd, "ab") as handle:
                _check_owned(os.fstat(handle.fileno()), name, directory=False)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())

    def path(self, *parts: str) -> Path:
        """``root/parts…`` as a path, for messages and for libraries that want one (after
        :meth:`folder` has checked the folders on the way)."""
        for part in parts:
            _check_name(part)
        return self.root.joinpath(*parts)


def _check_name(part: str) -> None:
    if not part or part in {".", ".."} or "/" in part or "\0" in part:
        raise ValueError(f"not a plain file or folder name: {part!r}")
