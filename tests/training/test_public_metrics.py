"""Metrics are opt-in and public: an allow-list of keys, JSONL rows, phase laps."""

from __future__ import annotations

import json

import pytest

from dpgrpo.config import TrainConfig
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.training.metrics import PHASES, PUBLIC_KEYS, TIMING_KEYS, Laps, open_metrics


def test_public_keys_are_the_allow_list():
    assert {"round", "rounds", "epsilon"} == PUBLIC_KEYS
    assert {"elapsed", "time/round", "time/rollout", "time/reference", "time/gradients",
            "time/mechanism", "time/step"} == TIMING_KEYS


def test_logger_refuses_private_keys_and_writes_jsonl(tmp_path):
    logger = open_metrics(("jsonl",), tmp_path)
    row = {"round": 1, "rounds": 2, "epsilon": 0.5}
    logger.log(row)
    for private in ("batch_size", "reward_mean", "length_mean", "clipped_records",
                    "elapsed", "time/reference", "time/round"):  # timings: opt-in only
        with pytest.raises(PrivacyError, match="public values only"):
            logger.log({**row, private: 1.0})
    logger.close()
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [row]
    assert open_metrics((), tmp_path) is None  # opt-in: nothing by default
    assert TrainConfig().metrics == ()


def test_backends_are_validated():
    assert TrainConfig(metrics=("jsonl", "tensorboard")).metrics == ("jsonl", "tensorboard")
    with pytest.raises(ConfigError, match=r"train.metrics"):
        TrainConfig(metrics=("csv",))


def test_laps_charge_time_to_phases(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 3.5])
    monkeypatch.setattr("dpgrpo.training.metrics.time.perf_counter", lambda: next(clock))
    laps = Laps()
    laps.mark("rollout")
    laps.mark("gradients")
    laps.mark("rollout")
    assert laps.row() == {"time/rollout": 1.5, "time/reference": 0.0, "time/gradients": 2.0,
                          "time/mechanism": 0.0, "time/step": 0.0}
    assert set(laps.row()) == {f"time/{p}" for p in PHASES} <= TIMING_KEYS


def test_timings_need_the_opt_in_and_stay_on_the_machine_in_releasable_runs(tmp_path):
    """Issue 32, defect 3: per-phase times reveal the realized batch size."""
    from dpgrpo.config import apply_overrides, embedded_default

    timed = {"round": 1, "rounds": 2, "epsilon": 0.5, "elapsed": 3.0, "time/reference": 0.2}
    with pytest.raises(PrivacyError, match=r"reveal the realized batch size.*public_timings"):
        open_metrics(("jsonl",), tmp_path).log(timed)
    opted = open_metrics(("jsonl",), tmp_path / "opted", timings=True)
    opted.log(timed)
    assert json.loads((tmp_path / "opted" / "metrics.jsonl").read_text()) == timed
    with pytest.raises(PrivacyError, match="batch_size"):
        opted.log({**timed, "batch_size": 4})  # the opt-in admits times, nothing else
    assert TrainConfig().public_timings is False
    base = embedded_default()
    with pytest.raises(ConfigError,
                       match=r"public_timings = true with train.metrics = \['wandb'\]"):
        apply_overrides(base, ["train.metrics=wandb", "train.public_timings=true"])
    # allowed: on the machine, or a run that is not releasable anyway (seeded, non-private)
    assert apply_overrides(base, ["train.metrics=jsonl,tensorboard",
                                  "train.public_timings=true"]).train.public_timings
    assert apply_overrides(base, ["train.metrics=wandb", "train.public_timings=true",
                                  "privacy.seed=3"]).train.public_timings
    assert apply_overrides(base, ["train.metrics=wandb"]).train.metrics == ("wandb",)
    with pytest.raises(ConfigError, match="releasable run"):
        open_metrics(("wandb",), tmp_path, timings=True, releasable=True)
