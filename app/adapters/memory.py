"""Giving memory back after a burst: what a burst made the process take, returned once it is quiet.

A burst of a few thousand requests leaves the process larger than it started although little of
what it made is still used (a 3,000 burst: some 3 MB of objects, once). The rest is held by the
allocators: pymalloc keeps a 1 MiB arena while one object in it lives, glibc keeps what ``free``
got back inside its heaps for the next ``malloc``, the worker threads the burst started stay, and
the pools keep their connections open (each SQLite connection with its page cache and prepared
statements). :class:`QuietRelease` gives back what glibc, the threads and the pools hold once
no counted request has come for a while; pymalloc's arenas stay (docs/performance.md, "Under a
burst").

glibc's ``malloc_trim`` is reached through :mod:`ctypes` and only where the C library is glibc
(``gnu_get_libc_version`` is there): elsewhere (musl, macOS) :func:`c_library` is None and
nothing here touches the allocator.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
from sqlalchemy import Engine

__all__ = ["Glibc", "QuietRelease", "c_library", "glibc_of"]

log = logging.getLogger("qoss.memory")

@dataclass(frozen=True)
class Glibc:
    """glibc's version and ``malloc_trim`` (public: ``malloc.h``)."""

    version: str
    malloc_trim: Callable[[int], int]


@functools.cache
def c_library() -> Glibc | None:
    """This process's C library if it is glibc, else None (see :func:`glibc_of`)."""
    return glibc_of(ctypes.CDLL(None))  # the symbols this process already has: its C library's among them


def glibc_of(library: Any) -> Glibc | None:
    """``library``'s ``malloc_trim`` if it is glibc (it has ``gnu_get_libc_version``), else None:
    musl has neither.

    Args:
        library: a :class:`ctypes.CDLL`, or any object with its functions as attributes.
    """
    try:
        version, trim = library.gnu_get_libc_version, library.malloc_trim
    except AttributeError:
        return None
    with contextlib.suppress(AttributeError, TypeError):  # ctypes functions; a test's fake has no types
        version.restype = ctypes.c_char_p
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    name = version()
    return Glibc(version=name.decode("ascii", "replace") if isinstance(name, bytes) else str(name),
                 malloc_trim=trim)


class QuietRelease:
    """After ``after`` seconds without a counted request, give back what the last burst took.

    In one worker thread (the call itself lets anyio end the worker threads idle for its 10 s):
    the engines' pools are replaced (:meth:`sqlalchemy.engine.Engine.dispose`: connections in the
    pool are closed, those in use are closed when given back), then glibc returns its free memory
    to the kernel (``malloc_trim(0)``). Once per quiet spell: nothing runs while nothing happens.

    Args:
        after: seconds without a request before the release; at least anyio's 10 s idle time
            for the worker threads to be ended by it.
        engines: the pools to empty (none: connections stay open).
        trim: call ``malloc_trim`` (where the C library is glibc).
        libc: the seam for tests (production: :func:`c_library`).
    """

    def __init__(self, *, after: float, engines: Iterable[Engine] = (), trim: bool = True,
                 libc: Glibc | None = None) -> None:
        self.after = after
        self.engines = tuple(engines)
        self.libc = (libc or c_library()) if trim else None
        self.releases = 0
        self._last = time.monotonic()
        self._owed = False

    def touch(self) -> None:
        """A request came: called for every counted request (an assignment and a clock read)."""
        self._last = time.monotonic()
        self._owed = True

    def release(self) -> None:
        """Empty the pools and return glibc's free memory (blocking: run in a worker thread)."""
        for engine in self.engines:
            engine.dispose()
        if self.libc is not None:
            self.libc.malloc_trim(0)
        self.releases += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: release once after each quiet spell of ``after`` seconds."""
        while not stop.is_set():
            quiet = time.monotonic() - self._last
            if self._owed and quiet >= self.after:
                self._owed = False
                try:
                    await anyio.to_thread.run_sync(self.release)
                except Exception:
                    log.exception("giving memory back failed")
            wait = self.after - quiet if self._owed and quiet < self.after else self.after
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.1, wait))
