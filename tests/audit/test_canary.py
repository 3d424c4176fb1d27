"""The canary signal and its bound (the plan itself: tests/training/test_canaries.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpgrpo.audit.canary import canary_signal, draw_inclusion
from dpgrpo.audit.features import DIBA_FEATURES


def test_signal_ranks_by_gain_then_likelihood():
    x = np.zeros((5, len(DIBA_FEATURES)))
    gain, ratio = DIBA_FEATURES.index("score_gain"), DIBA_FEATURES.index("likelihood_ratio")
    x[:, gain] = [0.0, 0.5, 0.0, 0.5, -0.5]
    x[:, ratio] = [3.0, -1.0, np.nan, 2.0, 9.0]
    assert canary_signal(x, DIBA_FEATURES).tolist() == [2.0, 3.0, 1.0, 4.0, 0.0]
    assert canary_signal(x, DIBA_FEATURES, "likelihood_ratio")[2] == -np.inf
    with pytest.raises(ValueError):
        canary_signal(x, DIBA_FEATURES, "nope")


def test_signal_to_bound_on_planted_features():
    """Included canaries improved (reward gain 0.5), the others did not: a large bound."""
    from dpgrpo.audit.one_run import one_run_audit

    rng = np.random.default_rng(0)
    included = np.array(draw_inclusion(400, torch.Generator().manual_seed(9)))
    x = rng.normal(size=(400, len(DIBA_FEATURES)))
    x[:, DIBA_FEATURES.index("score_gain")] = np.where(included, 0.5, 0.0)
    scores = canary_signal(x, DIBA_FEATURES)
    res = one_run_audit(scores, included, k_plus=40, k_minus=40, delta=1e-5)
    assert (res.r, res.v) == (80, 80)
    assert 2.5 < res.epsilon_lower_bound < 3.6               # logit(0.05 ** (1/80)) = 3.57
    noise = one_run_audit(canary_signal(rng.normal(size=x.shape), DIBA_FEATURES), included,
                          k_plus=40, k_minus=40, delta=1e-5)
    assert noise.epsilon_lower_bound < 1.0
