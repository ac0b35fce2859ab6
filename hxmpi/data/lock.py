"""One live run per node cache directory (and per checkpoint directory: ``hold_directory``).

Two runs that share a ``--cache-dir`` would evict and adopt each other's shards (the cache deletes
what its own run does not need), so hxmpi refuses a directory that a live run holds instead of
sharing it: the node leader takes an exclusive ``flock`` on ``DIR/.hxmpi.lock`` for as long as
its run stages data, and a second run gets ``CacheDirBusy`` naming the directory and the holder's
pid. The kernel drops the lock when the holder exits, also on SIGKILL, so a crashed run never
blocks the next one. (``flock`` is node-local on most network filesystems: give every job its own
directory there.)
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import HxmpiError

__all__ = ["CacheDirBusy", "CacheDirLock", "hold_cache_dir", "hold_directory"]

LOCK_NAME = ".hxmpi.lock"


class CacheDirBusy(HxmpiError, OSError):
    """The cache directory is held by another live run."""


class CacheDirLock:
    """A held cache directory; ``release()`` (or process exit) frees it."""

    def __init__(self, directory: Path, fd: int):
        self.directory, self._fd = directory, fd

    def release(self) -> None:
        """Free the directory for other runs (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def hold_cache_dir(directory) -> CacheDirLock:
    """Create ``directory`` if needed and hold it for this run; CacheDirBusy if a live run holds it."""
    return hold_directory(directory, "cache directory", "cache_dir", CacheDirBusy)


def hold_directory(directory, what: str, setting: str, error: type = CacheDirBusy) -> CacheDirLock:
    """Create ``directory`` if needed and hold it for this run (``what`` names it in the error, and
    the ``setting`` that chooses another); ``error`` naming the holder's pid if a live run holds it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise error(f"{what} {directory} is in use by a live run (pid {holder}); "
                    f"runs cannot share one: give this run another {setting}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return CacheDirLock(directory, fd)
