"""One writer per run, also under the unlink race (invariant 5: no second writer).

A releasing holder unlinks ``.lock`` while still holding it, then closes it. A writer that
opened the old file just before the unlink gets the flock on an inode no longer at the path,
while a third writer creates a new ``.lock`` and locks that: two writers, each certifying only
its own rounds. :class:`RunLock` re-checks after locking that its file is still the one at the
path; these tests interleave the race deterministically (flock locks belong to open file
descriptions, so one process can play every writer).
"""

from __future__ import annotations

import os

import pytest

from dpgrpo.errors import RunLockedError
from dpgrpo.rundir import lock as runlock
from dpgrpo.rundir.lock import RunLock


def test_a_writer_that_opened_the_unlinked_lock_file_does_not_hold_the_run(tmp_path,
                                                                             monkeypatch):
    first = RunLock(tmp_path).acquire()
    original_open, raced = os.open, []

    def open_then_holder_releases(path, flags, mode=0o777):
        fd = original_open(path, flags, mode)
        if not raced:  # the holder unlinks .lock and drops its flock right after this open
            raced.append(os.fstat(fd).st_ino)
            first.release()
        return fd

    monkeypatch.setattr(runlock.os, "open", open_then_holder_releases)
    second = RunLock(tmp_path).acquire()
    monkeypatch.undo()
    assert raced and second.held
    with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()  # a third writer is refused: one writer at a time
    # the second writer's lock is on the file now at the path (not an unlinked inode)
    assert os.fstat(second._fd).st_nlink == 1
    assert os.fstat(second._fd).st_ino == os.stat(tmp_path / ".lock").st_ino
    second.release()
    third = RunLock(tmp_path).acquire()  # and once it is gone, the run is free again
    assert third.held
    third.release()
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("code, error", [(28, "DiskFullError"), (30, "ReadOnlyError")])
@pytest.mark.parametrize("fresh", [True, False])
def test_a_lock_file_that_cannot_be_created_is_one_error_and_leaves_no_folder(
        tmp_path, monkeypatch, code, error, fresh):
    """No inode left (ENOSPC) or a read-only filesystem (EROFS) at the lock file, on a fresh
    start and on resume (issue 33: OSError tracebacks, and a fresh start left the folder)."""
    from dpgrpo import errors

    run_dir = tmp_path / "run"
    if not fresh:
        (run_dir / "recovery").mkdir(parents=True)  # an existing run: kept as it was

    def failing(path, flags, mode=0o777):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(runlock.os, "open", failing)
    with pytest.raises(getattr(errors, error), match=r"\.lock") as info:
        RunLock(run_dir).acquire()
    assert "\n" not in str(info.value)
    assert run_dir.exists() is not fresh
    assert fresh or sorted(p.name for p in run_dir.iterdir()) == ["recovery"]
