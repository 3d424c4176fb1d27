"""The canaries a run plants: content, inclusion bits and the saved plan."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from dpgrpo.errors import ReleaseError
from dpgrpo.training.canaries import CanaryPlan, draw_inclusion, make_canaries


def test_canaries_are_public_deterministic_and_verifiable():
    a, b = make_canaries(50, seed=3), make_canaries(50, seed=3)
    assert a == b and make_canaries(50, seed=4) != a
    assert [c.id for c in a[:3]] == ["canary-0000", "canary-0001", "canary-0002"]
    assert len({c.answer for c in a}) == 50                       # distinct answers
    for c in a:
        x, y, z = map(int, re.match(r"What is (\d+) \* (\d+) \+ (\d+)\?", c.question).groups())
        assert int(c.answer) == x * y + z
        assert 10 <= x <= 99 and 10 <= y <= 99 and 10 <= z <= 99
        assert c.solution.endswith(f"The answer is {c.answer}.")
    assert int(make_canaries(1, seed=0, digits=4)[0].question.split()[2]) >= 1000
    with pytest.raises(ValueError, match="more digits"):
        make_canaries(100, seed=0, digits=1)
    from dpgrpo.tasks import get_task

    task = get_task("arithmetic")
    assert all(task.reward(c.solution, c) == 1.0 for c in a[:5])
    assert task.reward("The answer is 1.", a[0]) == 0.0


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


def test_the_audit_reads_the_same_plan():
    # the trainer plants it (training/, below audit/); audit.canary re-exports the same names
    import dpgrpo.audit.canary as audit_canary
    import dpgrpo.training.canaries as training_canaries

    for name in ("CANARY_PLAN_VERSION", "CanaryPlan", "draw_inclusion", "make_canaries"):
        assert getattr(audit_canary, name) is getattr(training_canaries, name)
