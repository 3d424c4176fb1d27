"""Issue 56, part 3: both journal files lost charges the most rounds that can have run.

Only the journal proves the rounds run after the newest checkpoint. With both files gone (or
cut, garbled, rolled back below it) the resume charges, on top of what the other records
prove, every round that can have run before the next checkpoint, that checkpoint's own round
included (a kill while it is written), never past T. Shape: ``train.rounds = 12``,
``train.checkpoint_every = 5``. Before the fix, a run stopped after 7 rounds whose journals
were deleted resumed with 5 charged: 12 certified at the end for 14 run.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

import dpgrpo.training.trainer as trainer
from dpgrpo.privacy.journal import PrivacyJournal, scan
from dpgrpo.rundir.resume import Evidence, most_rounds_past, reconcile
from faultkit import (
    KILLED,
    SIGMA,
    Q,
    eps,
    kill_on_call,
    memoized_accountant,
    run_in_child,
    tiny_config,
)

__all__ = ["memoized_accountant"]  # the autouse fixture, imported to apply here

SHAPE = ("train.rounds=12", "train.checkpoint_every=5")
JOURNALS = ("journal.jsonl", "journal-twin.jsonl")


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


DAMAGES = {  # applied to both files
    "delete": lambda p: p.unlink(),
    "cut": lambda p: p.write_bytes(b"".join(_lines(p)[:3]) + _lines(p)[3][:20]),
    "garble": lambda p: p.write_bytes(os.urandom(p.stat().st_size).replace(b"\n", b"x")),
    "rollback": lambda p: p.write_bytes(b"".join(_lines(p)[:3])),
}


# --- the bound, without a model ------------------------------------------------------------

@pytest.mark.parametrize("reached, every, rounds, most", [
    (5, 5, 12, 5),    # rounds 6..10: the kill can come while step-000010 is written
    (10, 5, 12, 2),   # rounds 11..12: T caps it
    (12, 5, 12, 0),   # finished: nothing runs past the last checkpoint
    (0, 5, 12, 5),    # no checkpoint yet
    (0, 5, 3, 3),     # no checkpoint, T < checkpoint_every
    (4, 2, 4, 0),
])
def test_most_rounds_past(reached, every, rounds, most):
    assert most_rounds_past(reached, every, rounds) == most


def _journal(tmp_path, charged: int) -> PrivacyJournal:
    journal = PrivacyJournal(tmp_path / "j.jsonl", Q, SIGMA, twin=tmp_path / "t.jsonl")
    journal.open()
    for t in range(charged):
        journal.charge(t)
    return journal


@pytest.mark.parametrize("charged, expected", [
    (0, 10),   # both files lost: 5 proven by step-000005, 5 more can have run
    (3, 10),   # both rolled back below the checkpoint: the same
    (5, 5),    # a journal that reaches the checkpoint proves the rounds after it
    (7, 7),
])
def test_reconcile_charges_the_worst_case_only_when_the_journal_proves_nothing(
        tmp_path, charged, expected):
    journal = _journal(tmp_path, charged)
    evidence = [Evidence(5, "step-000005 (its ledger)", 5),
                Evidence(5, "recovery/telemetry.jsonl (rows)", 5)]
    note = reconcile(journal, evidence, 5, checkpoint_every=5, rounds=12)
    assert journal.rounds == expected
    assert (note is None) == (charged >= 5)
    if note is not None:
        assert "neither journal file proves" in note and "\n" not in note


def test_reconcile_takes_the_earliest_round_among_tied_records(tmp_path):
    """ledger.json (no round) ties the certificate of round 10: the bound is counted from
    the restored checkpoint, round 5, the larger one."""
    journal = _journal(tmp_path, 0)
    evidence = [Evidence(10, "release/certificate.json (rounds_charged)", 10),
                Evidence(10, "recovery/ledger.json", None)]
    reconcile(journal, evidence, 5, checkpoint_every=5, rounds=12)
    assert journal.rounds == 10 + 5


def test_no_record_at_all_charges_the_first_stretch(tmp_path):
    journal = _journal(tmp_path, 0)
    reconcile(journal, [], 0, checkpoint_every=5, rounds=12)
    assert journal.rounds == 5


# --- on the tiny model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped_after_7(tiny_model_dir, tmp_path_factory):
    """12 rounds, checkpoint every 5, interrupted after round 7 (rounds 6-7 past step-5)."""
    run_dir = tmp_path_factory.mktemp("after7") / "run"
    trainer.train(tiny_config(tiny_model_dir, *SHAPE), run_dir, stop_after=7)
    return run_dir


def _damage_public_records(run_dir) -> None:
    for path in (run_dir / "recovery" / "ledger.json",
                 run_dir / "release" / "certificate.json"):
        path.unlink()


def _charged_at_resume(run_dir) -> tuple[int, list[str]]:
    """Resume, run one round and stop: the certificate holds what the resume charged."""
    result = trainer.train(None, run_dir, resume=True, stop_after=1)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert cert["rounds_retained"] == 5
    assert cert["epsilon"] == pytest.approx(eps(cert["rounds_charged"]), rel=1e-12)
    return cert["rounds_charged"], list(result.notes)


@pytest.mark.parametrize("with_public", [False, True], ids=["", "+ledger+certificate"])
@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_both_journal_files_lost_never_charge_less_than_ran(stopped_after_7, tmp_path, kind,
                                                           with_public):
    run_dir = shutil.copytree(stopped_after_7, tmp_path / "run")
    for name in JOURNALS:
        assert scan(run_dir / "recovery" / name, Q, SIGMA).rounds == 7
        DAMAGES[kind](run_dir / "recovery" / name)
    if with_public:
        _damage_public_records(run_dir)
    charged, notes = _charged_at_resume(run_dir)
    # 7 ran; 5 proven by step-000005, and up to 5 more (rounds 6..10) can have run after it
    assert charged >= 7 and charged == 10
    assert eps(charged) >= eps(7)
    assert sum("neither journal file proves" in n for n in notes) == 1


def test_killed_while_writing_a_checkpoint_charges_checkpoint_every(tiny_model_dir, tmp_path):
    """Killed while step-000010 is written: rounds 6..10 ran past step-000005, which is
    checkpoint_every rounds, not checkpoint_every - 1."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, *SHAPE)

    def child():
        kill_on_call(trainer, "save_recovery", 2)  # the second checkpoint: round 10
        trainer.train(cfg, run_dir)

    assert run_in_child(child) == KILLED
    assert not (run_dir / "recovery" / "step-000010").exists()
    for name in JOURNALS:
        assert scan(run_dir / "recovery" / name, Q, SIGMA).rounds == 10
        (run_dir / "recovery" / name).unlink()
    charged, _ = _charged_at_resume(run_dir)
    assert charged >= 10


def test_a_full_resume_certifies_at_least_every_round_run(stopped_after_7, tmp_path):
    """Both files deleted after 7 rounds, resumed to the end: 7 run, then 7 replayed (6-12)."""
    run_dir = shutil.copytree(stopped_after_7, tmp_path / "run")
    for name in JOURNALS:
        (run_dir / "recovery" / name).unlink()
    result = trainer.train(None, run_dir, resume=True)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert result.rounds_done == 12 and cert["rounds_retained"] == 12
    assert cert["rounds_charged"] >= 7 + 7 and cert["rounds_charged"] == 10 + 7
    assert cert["epsilon"] == pytest.approx(eps(17), rel=1e-12) and cert["epsilon"] >= eps(14)
    for name in JOURNALS:
        assert scan(run_dir / "recovery" / name, Q, SIGMA).rounds == 17


def test_the_study_resumes_a_folder_whose_journals_are_lost_and_charges_what_ran(
        tiny_model_dir, tmp_path):
    """A study run interrupted before its first checkpoint, both journal files then lost:
    only recovery/config.json is left. The study's runner resumes it (it used to start it
    fresh, charging nothing for the rounds already run), so the certificate charges at least
    the 2 rounds run before plus the 4 of the finished run."""
    from dpgrpo.experiments.study_steps import _train_once

    config = tiny_config(tiny_model_dir, "train.rounds=4", "train.checkpoint_every=5")
    run_dir = tmp_path / "run"
    trainer.train(config, run_dir, stop_after=2)
    for name in JOURNALS:
        (run_dir / "recovery" / name).unlink()
    assert (run_dir / "recovery" / "config.json").exists()
    assert not (run_dir / "release").exists()
    assert not (run_dir / "recovery" / "ledger.json").exists()
    cert = _train_once(config, run_dir)
    assert cert["rounds_charged"] >= 2 + 4
    assert cert["epsilon"] >= eps(6) - 1e-9
