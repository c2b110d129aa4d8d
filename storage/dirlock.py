"""One owner per data directory: an exclusive flock on `<dir>/LOCK`, with the owner's pid in it.

A second opener, in this process or another, gets DataDirLocked at once (never waits). The
kernel drops the lock when the owner dies, however it dies, so a SIGKILLed node never leaves a
stale lock behind.
"""

from __future__ import annotations

import fcntl
import os

from storage.api import DataDirLocked, StorageError

LOCK_FILE = "LOCK"


def lock_dir(path: str) -> int:
    """Create `path` if needed and take the exclusive flock on `<path>/LOCK`; return its fd.
    Raises DataDirLocked at once if another open log holds it (never waits)."""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StorageError(f"cannot open the LMDB log at {path}: {e.strerror or e}; check the "
                           f"path exists, is writable and is not on a full disk") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _lock_owner(fd)
        os.close(fd)
        raise DataDirLocked(path, pid) from None
    except OSError as e:
        os.close(fd)
        raise StorageError(f"cannot lock the LMDB log at {path} ({e.strerror or e}); put the "
                           f"data dir on a local filesystem that supports flock") from e
    try:  # who holds it, for the next opener's error message (informational only)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def _lock_owner(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def unlock_dir(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
