"""config/durable.py: the one fsync_file / fsync_dir, shared by the journal and rundir/."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpgrpo.config import durable


def test_one_fsync_dir_for_the_journal_and_the_run_directory():
    import dpgrpo.privacy.journal as journal
    import dpgrpo.rundir.atomic as atomic

    assert atomic.fsync_dir is journal.fsync_dir is durable.fsync_dir
    assert atomic.fsync_file is durable.fsync_file


def test_the_run_directory_writer_stays_light():
    # rundir.atomic must not pull the accountant (scipy) or torch: the CLI imports it
    code = ("import sys, dpgrpo.rundir.atomic; print(sorted(m for m in "
            "('torch', 'scipy', 'numpy', 'dpgrpo.privacy.journal') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fsync_dir_is_best_effort_and_fsync_file_is_not(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    durable.fsync_dir(tmp_path)
    (tmp_path / "f").write_text("x")
    durable.fsync_file(tmp_path / "f")
    assert len(synced) == 2
    durable.fsync_dir(tmp_path / "missing")  # nothing to sync: no error
    with pytest.raises(FileNotFoundError):
        durable.fsync_file(tmp_path / "missing")
