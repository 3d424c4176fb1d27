"""Metrics are opt-in and public: an allow-list of keys, JSONL rows, phase laps."""

from __future__ import annotations

import json

import pytest

from dpgrpo.config import TrainConfig
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.metrics import PHASES, PUBLIC_KEYS, Laps, open_metrics


def test_public_keys_are_the_allow_list():
    assert PUBLIC_KEYS == {"round", "steps", "epsilon", "elapsed", "time/round",
                           "time/rollout", "time/reference", "time/gradients",
                           "time/mechanism", "time/step"}


def test_logger_refuses_private_keys_and_writes_jsonl(tmp_path):
    logger = open_metrics(("jsonl",), tmp_path)
    row = {"round": 1, "steps": 2, "epsilon": 0.5, "elapsed": 1.0}
    logger.log(row)
    for private in ("batch_size", "reward_mean", "length_mean", "clipped_records"):
        with pytest.raises(PrivacyError, match="public values only"):
            logger.log({**row, private: 1.0})
    logger.close()
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [row]
    assert open_metrics((), tmp_path) is None  # opt-in: nothing by default
    assert TrainConfig().metrics == ()


def test_backends_are_validated():
    assert TrainConfig(metrics=("jsonl", "tensorboard")).metrics == ("jsonl", "tensorboard")
    with pytest.raises(ConfigError, match="train.metrics"):
        TrainConfig(metrics=("csv",))


def test_laps_charge_time_to_phases(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 3.5])
    monkeypatch.setattr("dpgrpo.metrics.time.perf_counter", lambda: next(clock))
    laps = Laps()
    laps.mark("rollout")
    laps.mark("gradients")
    laps.mark("rollout")
    assert laps.row() == {"time/rollout": 1.5, "time/reference": 0.0, "time/gradients": 2.0,
                          "time/mechanism": 0.0, "time/step": 0.0}
    assert set(laps.row()) == {f"time/{p}" for p in PHASES} <= PUBLIC_KEYS
