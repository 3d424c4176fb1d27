"""Damaged recovery files, a full disk and a second writer on the tiny model: resume charges at
least what every surviving record proves, or stops with a one-line error naming the file
(docs/faults.md lists every case and its outcome)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import dpgrpo.rundir.checkpoint as checkpoint
import dpgrpo.training.trainer as trainer
from faultkit import (
    assert_consistent,
    memoized_accountant,
    release_rounds,
    temporaries,
    tiny_config,
)

__all__ = ["memoized_accountant"]  # the autouse fixture, imported to apply here


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A finished 4-round run (checkpoints at rounds 2 and 4), copied by each test."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    trainer.train(tiny_config(tiny_model_dir), run_dir)
    return run_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    return shutil.copytree(finished_run, tmp_path / "run")


def _journal_lines(run_dir, name: str = "journal.jsonl") -> list[bytes]:
    return (run_dir / "recovery" / name).read_bytes().splitlines(keepends=True)


JOURNALS = ("journal.jsonl", "journal-twin.jsonl")


def test_lost_journal_tail_never_certifies_less(run_dir):
    """Issue 16: journal (both files) cut to 2 lines, newest checkpoint gone, latest ->
    step-000002. Before the fix: rounds_charged 2 < rounds_retained 4 and a smaller epsilon."""
    for name in JOURNALS:
        (run_dir / "recovery" / name).write_bytes(b"".join(_journal_lines(run_dir, name)[:2]))
    shutil.rmtree(run_dir / "recovery" / "step-000004")
    (run_dir / "recovery" / "latest").write_text("step-000002\n")
    result = trainer.train(None, run_dir, resume=True)
    # 4 rounds proven by ledger.json and the release, then rounds 3-4 replayed: 6.
    assert_consistent(run_dir, 6)
    assert any("2 charged rounds are missing from the journal" in n for n in result.notes)


def test_deleted_journal_never_certifies_less(run_dir):
    for name in JOURNALS:  # both files: the checkpoints and the ledger still prove 4
        (run_dir / "recovery" / name).unlink()
    result = trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 4)  # proven by step-000004, ledger.json and the release
    assert any("4 charged rounds" in n for n in result.notes)


def test_truncated_newest_checkpoint_falls_back(run_dir):
    state = run_dir / "recovery" / "step-000004" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    result = trainer.train(None, run_dir, resume=True)
    assert any("step-000004/state.pt" in n and "resuming from step-000002" in n
               for n in result.notes)
    assert_consistent(run_dir, 6)  # rounds 3-4 replayed and charged again


def test_every_checkpoint_damaged_is_a_one_line_error(run_dir):
    from dpgrpo.errors import RecoveryError

    for step in ("step-000002", "step-000004"):
        (run_dir / "recovery" / step / "state.pt").write_bytes(b"")
    before = (run_dir / "recovery" / "journal.jsonl").read_bytes()
    with pytest.raises(RecoveryError, match="no intact checkpoint") as err:
        trainer.train(None, run_dir, resume=True)
    assert "step-000002/state.pt" in str(err.value) and "\n" not in str(err.value)
    assert (run_dir / "recovery" / "journal.jsonl").read_bytes() == before


@pytest.mark.parametrize("damage, charged", [
    (lambda ls: [ls[0], b"garbage\n", *ls[2:]], 4),         # covered by later totals
    (lambda ls: [*ls, b"garbage\n"], 5),                     # charged as one more round
    (lambda ls: [*ls, ls[-1][:25]], 5),                      # a torn last line: charged
])
def test_damaged_journal_lines_are_charged(run_dir, damage, charged):
    journal = run_dir / "recovery" / "journal.jsonl"
    journal.write_bytes(b"".join(damage(_journal_lines(run_dir))))
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, charged)
    assert journal.read_bytes().endswith(b"\n")  # repaired: later lines cannot glue on


def test_garbage_config_falls_back_to_its_toml_twin(run_dir):
    from dpgrpo.errors import RecoveryError

    (run_dir / "recovery" / "config.json").write_text("{garbage")
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 4)
    (run_dir / "recovery" / "config.toml").write_text("[train\n")
    with pytest.raises(RecoveryError, match=r"config.json is damaged.*config.toml is damaged"):
        trainer.train(None, run_dir, resume=True)


def test_contradicting_records_stop_the_resume(run_dir):
    from dpgrpo.errors import LedgerError

    ledger = run_dir / "recovery" / "ledger.json"
    data = json.loads(ledger.read_text())
    data["events"][0]["noise_multiplier"] = 2.0
    ledger.write_text(json.dumps(data))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(LedgerError, match="contradict"):
        trainer.train(None, run_dir, resume=True)
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_leftover_temporaries_are_removed(run_dir):
    (run_dir / ".release-abc").mkdir()
    (run_dir / "recovery" / ".step-xyz").mkdir()
    (run_dir / "recovery" / ".tmp-ledger.json-123").write_text("{")
    result = trainer.train(None, run_dir, resume=True)
    assert result.rounds_done == 4
    assert temporaries(run_dir) == []


def test_full_disk_names_the_place_and_keeps_no_half_release(tiny_model_dir, tmp_path,
                                                             monkeypatch):
    from dpgrpo.errors import DiskFullError

    original = torch.save
    calls = [0]

    def full_after_first(obj, path, *args, **kwargs):  # the disk fills up after checkpoint 1
        calls[0] += 1
        return original(obj, "/dev/full" if calls[0] > 1 else path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_after_first)
    run_dir = tmp_path / "run"
    with pytest.raises(DiskFullError, match=r"disk full while writing .*step-000004"):
        trainer.train(tiny_config(tiny_model_dir), run_dir)
    assert release_rounds(run_dir) == 2 and temporaries(run_dir) == []
    monkeypatch.setattr(checkpoint.torch, "save", original)
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 6)


# --- one writer per run ------------------------------------------------------------------

def test_second_writer_is_refused_with_the_holders_pid(run_dir, tiny_model_dir):
    import signal
    import time

    from dpgrpo.errors import RunLockedError
    from dpgrpo.rundir.lock import RunLock

    ready = run_dir.parent / "ready"

    def holder():  # a live writer: holds the lock until killed
        RunLock(run_dir).acquire()
        ready.write_text("1")
        time.sleep(60)

    pid = os.fork()
    if pid == 0:
        try:
            holder()
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        before = (run_dir / "recovery" / "journal.jsonl").read_bytes()
        with pytest.raises(RunLockedError,
                           match=f"in use by another dpgrpo process \\(pid {pid}\\)"):
            trainer.train(None, run_dir, resume=True)
        with pytest.raises(RunLockedError, match=f"pid {pid}"):
            trainer.train(tiny_config(tiny_model_dir), run_dir.parent / "run")
        assert (run_dir / "recovery" / "journal.jsonl").read_bytes() == before
    finally:
        os.kill(pid, signal.SIGKILL)  # kill -9: the lock dies with its holder
        os.waitpid(pid, 0)
    assert trainer.train(None, run_dir, resume=True).rounds_done == 4
    assert not (run_dir / ".lock").exists()


def test_the_invariant_guard_stops_an_under_count(run_dir, monkeypatch):
    """Were the reconciliation ever skipped, rounds_charged >= rounds_retained still holds:
    the resume stops before writing anything instead of certifying less."""
    from dpgrpo.errors import LedgerError

    monkeypatch.setattr(trainer, "reconcile", lambda journal, evidence, start, **bounds: None)
    for name in JOURNALS:
        (run_dir / "recovery" / name).unlink()
    release = (run_dir / "release" / "certificate.json").read_bytes()
    with pytest.raises(LedgerError, match="charges 0 rounds but the model retains 4"):
        trainer.train(None, run_dir, resume=True)
    assert (run_dir / "release" / "certificate.json").read_bytes() == release


def test_second_protocol_on_one_folder_is_refused(tiny_protocol_toml, tmp_path):
    from dpgrpo.config import load_protocol_config
    from dpgrpo.errors import RunLockedError
    from dpgrpo.experiments.protocol import plan_protocol, protocol_settings, run_protocol
    from dpgrpo.rundir.lock import RunLock

    cfg, table = load_protocol_config(tiny_protocol_toml)
    plan = plan_protocol(cfg, protocol_settings(table), tmp_path / "out")
    with (RunLock(plan.out_dir),
          pytest.raises(RunLockedError, match=f"pid {os.getpid()}.*one writer per protocol")):
        run_protocol(plan)
    assert not plan.out_dir.exists()  # the refused start left nothing behind


# --- checksums: flipped bytes that still load (issue 33) -----------------------------------

def _flip(path, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(count):
        data[middle + i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_newest_checkpoint_fall_back_to_the_previous(run_dir):
    meta = json.loads((run_dir / "recovery" / "step-000004" / "meta.json").read_text())
    assert len(meta["state_sha256"]) == 64  # recorded when written
    _flip(run_dir / "recovery" / "step-000004" / "state.pt")
    result = trainer.train(None, run_dir, resume=True)
    assert any("step-000004/state.pt" in n and "sha256" in n and "step-000002" in n
               for n in result.notes)
    assert_consistent(run_dir, 6)  # rounds 3-4 replayed from the intact step-000002


def test_flipped_bytes_in_the_release_are_caught_and_rewritten_on_resume(run_dir):
    from dpgrpo.rundir.atomic import sha256_file

    adapter = run_dir / "release" / "adapter_model.safetensors"
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert cert["files_sha256"]["adapter_model.safetensors"] == sha256_file(adapter)
    _flip(adapter)
    result = trainer.train(None, run_dir, resume=True)
    assert any("release/ rewritten" in n for n in result.notes)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert cert["files_sha256"]["adapter_model.safetensors"] == sha256_file(adapter)
    assert_consistent(run_dir, 4)


# --- full and read-only disks that used to end in tracebacks (issue 33) ---------------------

def test_full_disk_at_the_lock_file_leaves_no_lock_and_no_folder(tmp_path, monkeypatch):
    import errno

    from dpgrpo.errors import DiskFullError
    from dpgrpo.rundir import lock as runlock

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlock.os, "write", full)
    with pytest.raises(DiskFullError, match=r"disk full while writing .*\.lock"):
        runlock.RunLock(tmp_path / "run").acquire()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at inline_container.cc:603] . basic_ios::clear: iostream error"),
    OSError(30, "Read-only file system"),
])
def test_torch_short_write_and_read_only_disk_are_one_line_errors(tiny_model_dir, tmp_path,
                                                                 monkeypatch, error):
    from dpgrpo.errors import DiskFullError, ReadOnlyError

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(checkpoint.torch, "save", failing)
    expected = ReadOnlyError if isinstance(error, OSError) else DiskFullError
    with pytest.raises(expected, match="step-000002") as info:
        trainer.train(tiny_config(tiny_model_dir), tmp_path / "run")
    assert "\n" not in str(info.value)


def test_safetensors_full_disk_is_a_one_line_error():
    from safetensors import SafetensorError

    from dpgrpo.errors import DiskFullError
    from dpgrpo.rundir.atomic import disk_full_guard

    with (pytest.raises(DiskFullError, match="disk full while writing"),
          disk_full_guard(Path("/tmp/release"))):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" }) os error 28")
