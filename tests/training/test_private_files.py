"""Issue 56: every private file a run writes is the owner's only (0600, in 0700 folders).

The runs below use umask 0, so every mode a file or folder ends up with was set by dpgrpo, not
inherited from the test machine. Only release/ (public by design), metrics.jsonl (public
values, allow-listed by training.metrics) and .lock (the writer's pid) may lie outside
recovery/; a new file anywhere else fails the first test until it is placed and moded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_trainer import tiny_config

from dpgrpo.release.files import RELEASE_FILES
from dpgrpo.training.trainer import train

PUBLIC_BESIDE_RECOVERY = {"metrics.jsonl", ".lock"}


@pytest.fixture
def umask_zero():
    old = os.umask(0)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    """Path relative to ``root`` -> permission bits, for every folder and file under it."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode)
            for p in [root, *root.rglob("*")] if p != root}


def _check_private(run_dir: Path) -> dict[str, int]:
    modes = _modes(run_dir)
    private = {k: v for k, v in modes.items() if k == "recovery" or k.startswith("recovery/")}
    wrong = {k: oct(v) for k, v in private.items()
             if v != (0o700 if (run_dir / k).is_dir() else 0o600)}
    assert not wrong, f"private paths not owner-only: {wrong}"
    elsewhere = {k for k in modes if k not in private and k != "release"}
    assert elsewhere <= {f"release/{f}" for f in RELEASE_FILES} | PUBLIC_BESIDE_RECOVERY
    return private


def test_every_private_file_a_run_writes_is_0600_in_a_0700_folder(tiny_model_dir, tmp_path,
                                                                  umask_zero):
    run_dir = tmp_path / "run"
    train(tiny_config(tiny_model_dir, "train.rounds=2", "train.checkpoint_every=1",
                      "train.metrics=jsonl", "audit.canaries=2"), run_dir)
    private = _check_private(run_dir)
    names = {Path(k).name for k in private}
    assert {"telemetry.jsonl", "journal.jsonl", "journal-twin.jsonl", "ledger.json",
            "config.json", "config.toml", "canaries.json", "latest", "state.pt",
            "meta.json"} <= names                               # each of them was checked
    assert (run_dir / "metrics.jsonl").exists()


def test_resume_makes_an_older_run_directory_private(tiny_model_dir, tmp_path, umask_zero):
    """A run written before issue 56 (0755 recovery/, 0644 telemetry.jsonl and state.pt):
    resuming it sets every private path owner-only, the appended telemetry included."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, "train.rounds=3", "train.checkpoint_every=1")
    train(cfg, run_dir, stop_after=1)
    recovery = run_dir / "recovery"
    for path in [recovery, *recovery.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    telemetry = recovery / "telemetry.jsonl"
    rows = len(telemetry.read_text().splitlines())
    train(None, run_dir, resume=True)
    _check_private(run_dir)
    assert len(telemetry.read_text().splitlines()) > rows       # appended to, still 0600
