"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock`` (invariant 5).

Two processes writing one run would interleave the privacy journal, checkpoints and the
release, and each would certify only its own rounds. ``train``, ``train --resume`` and
``protocol`` therefore hold :class:`RunLock` for as long as they write. The lock dies with its
process (the kernel drops ``flock`` locks when the file is closed, also on SIGKILL), so a
crashed run never leaves a stale lock; the file holds the holder's pid for the error message
and is removed on a clean exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from dpgrpo.errors import RunLockedError
from dpgrpo.rundir.atomic import disk_full_guard

LOCK_NAME = ".lock"


class RunLock:
    """Exclusive, non-blocking lock on a directory; use as a context manager."""

    def __init__(self, directory: str | Path, *, what: str = "run directory") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.what = what
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder's pid."""
        self._created = not self.directory.exists()
        with disk_full_guard(self.path):
            self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                self._created = False
                raise RunLockedError(
                    f"{self.directory} is in use by another dpgrpo process (pid {holder}); "
                    f"one writer per {self.what}: wait for it to finish or stop it") from None
            except OSError:
                os.close(fd)
                raise
            if _same_file(fd, self.path):  # not unlinked by a holder that just released it
                break
            os.close(fd)
        self._fd = fd
        try:
            with disk_full_guard(self.path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:  # a full disk: no lock file (or run directory) left behind
            self.release()
            raise
        return self

    def _open(self) -> int:
        """Open (or create) the lock file; on a full or read-only disk, remove the directory if
        this lock created it, so a refused start leaves nothing behind."""
        try:
            with disk_full_guard(self.path):
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if self._created:
                with contextlib.suppress(OSError):
                    self.directory.rmdir()
                self._created = False
            raise

    def release(self) -> None:
        """Remove the lock file, drop the lock, and remove the directory if this lock created
        it and nothing else was written there (a failed start leaves nothing behind)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: no one else can
            if self._created:
                with contextlib.suppress(OSError):  # not empty (or already gone): keep it
                    self.directory.rmdir()
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return "unknown"
    return text if text.isdigit() else "unknown"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


__all__ = ["LOCK_NAME", "RunLock"]
