"""A run directory written by dpgrpo 0.2.0, which named the rounds T ``steps`` (``train.steps``
in its configs, ``"steps"`` in its certificate): it is still read, checked, audited and resumed,
and the resume writes today's names."""

from __future__ import annotations

import json

import pytest

import dpgrpo.training.trainer as trainer
from dpgrpo.audit.mechanism_audit import read_certificate, setup_from_certificate
from dpgrpo.errors import ConfigError
from dpgrpo.experiments.protocol import check_run_dir, check_shared_budget
from dpgrpo.release.files import certified_rounds
from dpgrpo.rundir.layout import RunDir
from dpgrpo.rundir.resume import read_run_config
from faultkit import assert_consistent, memoized_accountant, tiny_config

__all__ = ["memoized_accountant"]  # the autouse fixture, imported to apply here


def _as_written_by_0_2_0(run_dir) -> None:
    """Rename T as dpgrpo 0.2.0 wrote it, in every file of the run that names it."""
    layout = RunDir(run_dir)
    for path in (layout.config_json, layout.public_config_path):
        data = json.loads(path.read_text())
        data["train"]["steps"] = data["train"].pop("rounds")
        path.write_text(json.dumps(data))
    toml = layout.config_toml.read_text()
    assert "\nrounds = 4\n" in toml
    layout.config_toml.write_text(toml.replace("\nrounds = 4\n", "\nsteps = 4\n"))
    cert = json.loads(layout.certificate_path.read_text())
    cert["steps"] = cert.pop("rounds")
    layout.certificate_path.write_text(json.dumps(cert))


@pytest.fixture
def old_run(tiny_model_dir, tmp_path):
    """4 rounds, interrupted after round 2 (checkpoint and release at round 2), as 0.2.0
    wrote it."""
    run_dir = tmp_path / "run"
    trainer.train(tiny_config(tiny_model_dir), run_dir, stop_after=2)
    _as_written_by_0_2_0(run_dir)
    return run_dir


def test_an_old_run_directory_is_read_checked_audited_and_resumed(old_run, tiny_model_dir):
    layout = RunDir(old_run)
    assert "steps" in json.loads(layout.config_json.read_text())["train"]
    assert read_run_config(old_run).train.rounds == 4              # recovery/config.json
    check_run_dir(tiny_config(tiny_model_dir), old_run)            # the same run: not refused
    with pytest.raises(ConfigError, match=r"differs in train\.rounds"):
        check_run_dir(tiny_config(tiny_model_dir, "train.rounds=5"), old_run)
    layout.config_json.write_text("{garbage")       # its TOML twin, and the public config
    assert read_run_config(old_run).train.rounds == 4
    check_run_dir(tiny_config(tiny_model_dir), old_run)
    with pytest.raises(ConfigError, match=r"differs in train\.rounds"):
        check_run_dir(tiny_config(tiny_model_dir, "train.rounds=5"), old_run)

    cert = read_certificate(old_run)                                # the audits' reader
    assert "rounds" not in cert and certified_rounds(cert) == 4
    assert setup_from_certificate(cert).rounds == 4
    assert check_shared_budget({"old": cert, "new": {**cert, "rounds": cert["steps"]}}) == \
        cert["epsilon"]

    result = trainer.train(None, old_run, resume=True)
    assert result.rounds_done == 4
    assert_consistent(old_run, 4)                                   # charged 4, retained 4
    cert = json.loads(layout.certificate_path.read_text())
    assert cert["rounds"] == 4 and "steps" not in cert             # written with today's name
    public = json.loads(layout.public_config_path.read_text())["train"]
    assert public["rounds"] == 4 and "steps" not in public


def test_a_finished_old_run_is_complete_for_the_protocol(tiny_model_dir, tmp_path):
    """A study or protocol rerun over a finished 0.2.0 run reads it as done, never retrains."""
    from dpgrpo.experiments.study_steps import _train_once

    run_dir = tmp_path / "run"
    trainer.train(tiny_config(tiny_model_dir), run_dir)
    _as_written_by_0_2_0(run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cert = _train_once(tiny_config(tiny_model_dir), run_dir)
    assert certified_rounds(cert) == 4 and cert["rounds_retained"] == 4
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
