"""Only public quantities reach logs and metrics (invariant 6; issue 32, defect 3 and the
"private values logged at warning level" mutation).

A tiny private run on a gsm8k file with invalid rows (skipped: a private count) writes metrics
rows of public keys only, keeps the per-phase times in ``recovery/telemetry.jsonl``, and its
``dpgrpo`` loggers say nothing at any level: every record a clean run emits would be a way for
the realized batch size, the rewards or the skipped-invalid count to reach a log.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.training.metrics import PUBLIC_KEYS, TIMING_KEYS
from dpgrpo.training.trainer import train
from faultkit import memoized_accountant

__all__ = ["memoized_accountant"]  # the autouse fixture (a pure accountant, memoized)

#: Names of private per-round values (recovery/telemetry.jsonl) and of the skipped count.
PRIVATE = re.compile(r"batch|reward|length|clipped|nonfinite|skipp|invalid|prompts|records|norm",
                     re.IGNORECASE)


def _gsm8k_dir(tmp_path, rows: int, invalid: set[int]):
    folder = tmp_path / "data" / "gsm8k"
    folder.mkdir(parents=True)
    lines = []
    for i in range(rows):
        answer = "no final answer" if i in invalid else f"{i} + 1 = {i + 1}\n#### {i + 1}"
        lines.append(json.dumps({"question": f"What is {i} + 1?", "answer": answer}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "data"


def _config(model_dir, data_dir, *extra: str):
    return apply_overrides(embedded_default(), [
        f"model.name={model_dir}", "model.device=cpu", "data.task=gsm8k",
        f"data.data_dir={data_dir}", "data.skip_invalid=true", "data.limit=none",
        "data.n_slots=20", "privacy.expected_batch=6", "privacy.noise_multiplier=1.0",
        "train.rounds=3", "train.group_size=2", "train.max_new_tokens=4",
        "train.checkpoint_every=1", "train.metrics=jsonl", *extra])


class _Everything(logging.Handler):
    """Keeps every record of the ``dpgrpo`` loggers, whatever its level."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured():
    handler, logger = _Everything(), logging.getLogger("dpgrpo")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_a_run_logs_no_private_value_at_any_level(tiny_model_dir, tmp_path, captured):
    data = _gsm8k_dir(tmp_path, 16, invalid={1, 4, 9})
    run_dir = tmp_path / "run"
    train(_config(tiny_model_dir, data), run_dir)
    telemetry = [json.loads(x) for x in (run_dir / "recovery" / "telemetry.jsonl")
                 .read_text().splitlines()]
    assert len(telemetry) == 3 and all("batch_size" in row for row in telemetry)
    messages = [r.getMessage() for r in captured]
    assert [m for m in messages if PRIVATE.search(m)] == []
    # a clean run is silent: nothing for a private value to ride on. The exceptions are the
    # public config's own warning that a local base folder is named by its basename in release/,
    # and the phase lines before round 1, which name the configured task and model only
    machine = [m for m in messages if "is a path of this machine" in m]
    phases = [r.getMessage() for r in captured if r.name == "dpgrpo.progress"]
    assert phases == ["reading the data (task gsm8k)", f"loading the model {tiny_model_dir}"]
    assert len(machine) <= 1 and [m for m in messages
                                  if m not in machine and m not in phases] == []


def test_phase_times_stay_private_unless_opted_in(tiny_model_dir, tmp_path):
    """Issue 32, defect 3: time/reference tracks the realized batch size (+0.996)."""
    data = _gsm8k_dir(tmp_path, 16, invalid=set())
    run_dir = tmp_path / "run"
    train(_config(tiny_model_dir, data), run_dir)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(set(r) == PUBLIC_KEYS for r in rows)  # no time/*, no elapsed
    telemetry = [json.loads(x) for x in (run_dir / "recovery" / "telemetry.jsonl")
                 .read_text().splitlines()]
    assert all(r["time/reference"] > 0 and r["time/rollout"] > 0 and r["time/round"] > 0
               for r in telemetry)  # kept, with the round's other private values
    opted = tmp_path / "opted"
    train(_config(tiny_model_dir, data, "train.public_timings=true"), opted)
    rows = [json.loads(x) for x in (opted / "metrics.jsonl").read_text().splitlines()]
    assert all(set(r) == PUBLIC_KEYS | TIMING_KEYS and r["time/reference"] > 0 for r in rows)
    assert not (run_dir / "release" / "metrics.jsonl").exists()
