"""Canaries: content, inclusion bits, the saved plan and the canary signal."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from dpgrpo.audit.canary import CanaryPlan, canary_signal, draw_inclusion, make_canaries
from dpgrpo.audit.features import DIBA_FEATURES
from dpgrpo.errors import ReleaseError


def test_canaries_are_public_deterministic_and_verifiable():
    a, b = make_canaries(50, seed=3), make_canaries(50, seed=3)
    assert a == b and make_canaries(50, seed=4) != a
    assert [c.id for c in a[:3]] == ["canary-0000", "canary-0001", "canary-0002"]
    assert len({c.answer for c in a}) == 50                       # distinct answers
    for c in a:
        x, y, z = map(int, re.match(r"What is (\d+) \* (\d+) \+ (\d+)\?", c.question).groups())
        assert int(c.answer) == x * y + z
        assert c.solution.endswith(f"#### {c.answer}")


def test_inclusion_bits():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert draw_inclusion(64, g1) == draw_inclusion(64, g2)
    bits = draw_inclusion(4000)                                  # OS entropy
    assert len(bits) == 4000 and 0.45 < np.mean(bits) < 0.55
    assert draw_inclusion(0) == []


def test_plan_round_trip_and_release_refusal(tmp_path):
    plan = CanaryPlan.create(6, seed=1, generator=torch.Generator().manual_seed(2))
    path = plan.save(tmp_path / "run" / "recovery" / "canaries.json")
    back = CanaryPlan.load(path)
    assert back == plan and back.seed == 1
    assert json.loads(path.read_text())["included"] == list(plan.included)
    assert len(plan.present) == sum(plan.included)
    with pytest.raises(ReleaseError, match="secret"):
        plan.save(tmp_path / "run" / "release" / "canaries.json")
    with pytest.raises(ValueError):
        CanaryPlan(plan.canaries, plan.included[:-1])
    with pytest.raises(ValueError):
        CanaryPlan(plan.canaries, plan.included, slots=(1, 1, 2, 3, 4, 5))


def test_signal_ranks_by_gain_then_likelihood():
    x = np.zeros((5, len(DIBA_FEATURES)))
    gain, ratio = DIBA_FEATURES.index("score_gain"), DIBA_FEATURES.index("likelihood_ratio")
    x[:, gain] = [0.0, 0.5, 0.0, 0.5, -0.5]
    x[:, ratio] = [3.0, -1.0, np.nan, 2.0, 9.0]
    assert canary_signal(x, DIBA_FEATURES).tolist() == [2.0, 3.0, 1.0, 4.0, 0.0]
    assert canary_signal(x, DIBA_FEATURES, "likelihood_ratio")[2] == -np.inf
    with pytest.raises(ValueError):
        canary_signal(x, DIBA_FEATURES, "nope")
