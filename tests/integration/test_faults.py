"""Fault injection on the tiny model: kill -9 at each phase of a round and of a checkpoint,
then resume. The ledger never under-counts, release/ always matches the newest checkpoint,
and nothing half-written survives (docs/faults.md lists every case and its outcome)."""

from __future__ import annotations

import pytest

import dpgrpo.privacy.journal as journal_module
import dpgrpo.release.write as release_write
import dpgrpo.rundir.checkpoint as checkpoint
import dpgrpo.training.trainer as trainer
from dpgrpo.privacy.journal import scan
from dpgrpo.privacy.sampling import PoissonSampler
from faultkit import (
    KILLED,
    SIGMA,
    Q,
    assert_consistent,
    certificate,
    die,
    kill_on_call,
    memoized_accountant,
    release_rounds,
    run_in_child,
    temporaries,
    tiny_config,
)

__all__ = ["memoized_accountant"]  # the autouse fixture, imported to apply here


def kill_during(point: str) -> None:
    """Patch one phase of the loop (in the child) so that the process dies there."""
    latest_4 = lambda path, text: path.name == "latest" and "step-000004" in text  # noqa: E731
    aside = lambda src, dst, *a, **k: str(dst).endswith(".release-old")  # noqa: E731
    phases = {
        # a round: charged but not started; coins drawn; after the noisy AdamW step
        "charged": lambda: kill_on_call(trainer.PrivacyJournal, "charge", 3, when="after"),
        "sampled": lambda: kill_on_call(PoissonSampler, "sample", 3, when="after"),
        "stepped": lambda: kill_on_call(trainer, "apply_update", 4, when="after"),
        # the round-4 checkpoint: state.pt half written; the step folder in place but `latest`
        # not moved; `latest` moved but neither telemetry nor release written; the release
        # built but not swapped in; the old release moved aside, the new one not yet in place
        "state-half-written": lambda: _half_written(checkpoint.torch, "save", 2),
        "before-latest": lambda: kill_on_call(checkpoint, "atomic_write_text", 1, match=latest_4),
        "before-release": lambda: kill_on_call(trainer, "append_lines", 2),
        "release-built": lambda: kill_on_call(release_write, "_build_release", 2, when="after"),
        "release-moved-aside": lambda: kill_on_call(checkpoint.os, "replace", 1, when="after",
                                                    match=aside),
        # the journal: round 3's charge line torn mid-write in journal.jsonl (each charge is
        # written to journal.jsonl, then to journal-twin.jsonl: write 5), or in the twin (6)
        "journal-torn": lambda: _torn_journal_write(5),
        "twin-torn": lambda: _torn_journal_write(6),
    }
    phases[point]()


def _half_written(owner, name: str, nth: int) -> None:
    """The nth ``torch.save`` leaves half of its file behind and the process dies."""
    original, calls = getattr(owner, name), [0]

    def half(obj, path, *args, **kwargs):
        calls[0] += 1
        original(obj, path, *args, **kwargs)
        if calls[0] == nth:
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            die()

    setattr(owner, name, half)


def _torn_journal_write(nth: int) -> None:
    """The nth charge line is written half, then the process dies."""
    original, calls = journal_module.os.write, [0]

    def torn(fd, data):
        if b'"kind":"charge"' in bytes(data):
            calls[0] += 1
            if calls[0] == nth:
                original(fd, bytes(data)[: len(data) // 2])
                die()
        return original(fd, data)

    journal_module.os.write = torn


CASES = [
    ("charged", lambda d: release_rounds(d) == 2, 5),
    ("sampled", lambda d: release_rounds(d) == 2, 5),
    ("stepped", lambda d: release_rounds(d) == 2, 6),
    ("state-half-written", lambda d: any(n.startswith(".step-") for n in temporaries(d)), 6),
    ("before-latest", lambda d: (d / "recovery" / "latest").read_text() == "step-000002\n"
     and (d / "recovery" / "step-000004").is_dir(), 4),
    ("before-release", lambda d: (d / "recovery" / "latest").read_text() == "step-000004\n"
     and release_rounds(d) == 2, 4),  # the stale final release of issue 16
    ("release-built", lambda d: any(n.startswith(".release-") for n in temporaries(d))
     and release_rounds(d) == 2, 4),
    ("release-moved-aside", lambda d: not (d / "release").exists(), 4),
    ("journal-torn", lambda d: not (d / "recovery" / "journal.jsonl").read_bytes().endswith(b"\n"),
     5),
    ("twin-torn", lambda d: not (d / "recovery" / "journal-twin.jsonl").read_bytes()
     .endswith(b"\n"), 5),
]


@pytest.mark.parametrize("point, left, charged", CASES, ids=[c[0] for c in CASES])
def test_kill_then_resume(tiny_model_dir, tmp_path, point, left, charged):
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir)

    def child():
        kill_during(point)
        trainer.train(cfg, run_dir)

    assert run_in_child(child) == KILLED
    assert left(run_dir)
    journal_before = scan(run_dir / "recovery" / "journal.jsonl", Q, SIGMA).rounds
    result = trainer.train(None, run_dir, resume=True)
    assert result.rounds_done == 4
    assert_consistent(run_dir, charged)
    assert charged >= journal_before
    # A second resume finds a finished, consistent run and changes nothing.
    before = {p: p.read_bytes() for p in (run_dir / "recovery").glob("*.json*")}
    again = trainer.train(None, run_dir, resume=True)
    assert again.certificate == certificate(run_dir) and again.notes == ()
    assert before == {p: p.read_bytes() for p in (run_dir / "recovery").glob("*.json*")}
