"""The canary audit on a run the trainer really produced (tiny model): canaries placed by the
trainer are scored from release/ and the one-run bound sits beside the certified epsilon."""

from __future__ import annotations

import numpy as np

from dpgrpo.audit.canary import CanaryPlan
from dpgrpo.audit.pipeline import run_canary_audit
from dpgrpo.audit.scoring import SamplingSettings
from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.training.trainer import train


def test_canary_audit_on_a_trained_run(tiny_model_dir, tmp_path):
    cfg = apply_overrides(embedded_default(), [
        f"model.name={tiny_model_dir}", "model.device=cpu", "data.limit=40", "audit.canaries=8",
        "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=2",
        "train.group_size=2", "train.max_new_tokens=5", "train.checkpoint_every=2"])
    cert = train(cfg, tmp_path / "run").certificate
    outcome = run_canary_audit(tmp_path / "run", k_plus=1, k_minus=1,
                               settings=SamplingSettings(n_samples=2, max_new_tokens=4))
    plan = CanaryPlan.load(tmp_path / "run" / "recovery" / "canaries.json")
    assert outcome.ids == [c.id for c in plan.canaries]
    assert np.array_equal(outcome.included, np.array(plan.included))
    assert 0.0 <= outcome.audit.epsilon_lower_bound <= cert["epsilon"]
