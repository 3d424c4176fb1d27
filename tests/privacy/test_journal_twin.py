"""Issue 32, defect 2: no single lost or damaged file lowers epsilon.

The rounds after the newest checkpoint are proven only by the journal, so it is kept in two
independent files, each charge fsynced to both before the round touches data. The repro shape of
the issue: ``train.rounds = 12``, ``train.checkpoint_every = 10``, interrupted after round 9 (no
checkpoint yet), one file damaged, resumed. With a single journal, keeping its first 3 lines
certified 15 rounds for 21 run. Shape "after 11" adds the ledger and the certificate (written at
round 10) to the damage: 11 rounds run, then 2 replayed from the round-10 checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

import dpgrpo.training.trainer as trainer
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.privacy.journal import scan
from faultkit import SIGMA, Q, memoized_accountant, tiny_config

__all__ = ["memoized_accountant"]  # the autouse fixture, imported to apply here

SHAPE = ("train.rounds=12", "train.checkpoint_every=10")
JOURNALS = ("journal.jsonl", "journal-twin.jsonl")


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _cut(path) -> None:
    """Cut mid-line after 3 whole lines (a torn fourth line)."""
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])


def _rollback(path) -> None:
    """An older copy of an append-only file: its first 3 whole lines."""
    path.write_bytes(b"".join(_lines(path)[:3]))


def _garble(path) -> None:
    """Every byte replaced by random bytes, newlines removed (one unreadable line)."""
    path.write_bytes(os.urandom(path.stat().st_size).replace(b"\n", b"x"))


def _delete(path) -> None:
    path.unlink()


DAMAGES = {"cut": _cut, "delete": _delete, "garble": _garble, "rollback": _rollback}


def _damage_public_records(run_dir, kind: str) -> None:
    """The same damage to ledger.json and the certificate (a rollback: to before round 10,
    when neither existed)."""
    for path in (run_dir / "recovery" / "ledger.json",
                 run_dir / "release" / "certificate.json"):
        if kind in ("delete", "rollback"):
            path.unlink()
        elif kind == "cut":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            _garble(path)


@pytest.fixture(scope="module")
def interrupted(tiny_model_dir, tmp_path_factory):
    """Two interrupted runs of the issue's shape: after round 9 (only the journal proves its
    rounds) and after round 11 (the round-10 checkpoint, ledger and certificate exist)."""
    runs = {}
    for after in (9, 11):
        run_dir = tmp_path_factory.mktemp(f"after{after}") / "run"
        trainer.train(tiny_config(tiny_model_dir, *SHAPE), run_dir, stop_after=after)
        runs[after] = run_dir
    return runs


def _eps(rounds: int) -> float:
    return compute_epsilon(40, 4, rounds, SIGMA, 1 / 400).epsilon


@pytest.mark.parametrize("after, with_public, run_total", [(9, False, 21), (11, True, 13)],
                         ids=["after9", "after11+ledger+certificate"])
@pytest.mark.parametrize("name", JOURNALS)
@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_one_damaged_journal_file_never_certifies_less(interrupted, tmp_path, after,
                                                       with_public, run_total, name, kind):
    run_dir = shutil.copytree(interrupted[after], tmp_path / "run")
    for journal in JOURNALS:  # before the damage: both files charge every round run
        assert scan(run_dir / "recovery" / journal, Q, SIGMA).rounds == after
    DAMAGES[kind](run_dir / "recovery" / name)
    if with_public:
        _damage_public_records(run_dir, kind)
    result = trainer.train(None, run_dir, resume=True)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    # after 9: 9 run, then all 12 from scratch; after 11: 11 run, then rounds 11-12 again
    assert cert["rounds_retained"] == 12 and result.rounds_done == 12
    assert cert["rounds_charged"] == run_total  # nothing lost (and nothing spurious)
    assert cert["epsilon"] == pytest.approx(_eps(run_total), rel=1e-12)
    for journal in JOURNALS:  # both files again charge at least every round run
        assert scan(run_dir / "recovery" / journal, Q, SIGMA).rounds == cert["rounds_charged"]
    # the resume said what it repaired (the damaged file, by name)
    assert any(name in note for note in result.notes)


def test_both_files_hold_the_charge_before_the_round_touches_data(tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    """At the Poisson sample (the first use of the data), both journal files already charge
    the round: the twin is written before, not after, the round runs."""
    run_dir = tmp_path / "run"
    seen: list[tuple[int, int]] = []
    original = trainer.broadcast_object

    def spy(obj, ctx):
        seen.append(tuple(scan(run_dir / "recovery" / n, Q, SIGMA).rounds for n in JOURNALS))
        return original(obj, ctx)

    monkeypatch.setattr(trainer, "broadcast_object", spy)
    trainer.train(tiny_config(tiny_model_dir), run_dir)
    # every broadcast of round t (the sample, then the round's record key) sees t charges in
    # both files: the charge is durable twice before any of the round's data is touched
    assert seen and all(a == b for a, b in seen)
    assert sorted(set(seen)) == [(t, t) for t in range(1, 5)]
