"""One non-private GRPO step moves the policy the way the advantages say (Eq. 7's sign)."""

from __future__ import annotations

import math

import torch

from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    compute_advantages,
    reference_logprobs,
)
from dpgrpo.objectives.logprobs import token_logprobs
from dpgrpo.privacy.mechanism import privatize
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.training.grads import per_prompt_grads, trainable_parameters
from dpgrpo.verify.fixtures import synthetic_rollouts, tiny_fp64_policy


def _mean_logprob(model, rollouts) -> torch.Tensor:
    """(rows,) mean token log-prob of each completion under ``model``."""
    with torch.no_grad():
        lp = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask,
                            mask=rollouts.completion_mask)
    mask = rollouts.completion_mask.to(lp.dtype)
    return (lp * mask).sum(1) / mask.sum(1)


def _one_step(model, rollouts, advantages, lr: float = 0.05) -> torch.Tensor:
    """Change of each row's mean token log-prob after one step through the mechanism."""
    b = rollouts.num_prompts
    batch = build_grpo_batch(rollouts, torch.zeros_like(advantages), advantages,
                             reference_logprobs(model, rollouts))
    before = _mean_logprob(model, rollouts)
    grads = per_prompt_grads(model, GRPOObjective(beta=0.0), batch)
    update = privatize(grads, clip_norm=math.inf, noise_multiplier=0.0, expected_batch=float(b),
                       noise=NoiseSource(seed=0)).update
    params = trainable_parameters(model)
    saved = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        for name, p in params.items():
            p -= lr * update[name].to(p.dtype)
    after = _mean_logprob(model, rollouts)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(saved[name])
    return after - before


def test_one_step_raises_positive_advantage_completions_over_negative_ones():
    """Over several initializations and rollout draws: after one step, the completions with
    A > 0 gain mean token log-prob relative to those with A < 0, on average and in (nearly)
    every group; with zero advantages and no KL term nothing moves."""
    rewards = torch.tensor([[1., 0, 0, 1, 0, 1], [0, 0, 0, 0, 1, 0],
                            [1, 1, 1, 0, 1, 1], [0, 1, 0, 1, 0, 0]], dtype=torch.float64)
    adv = compute_advantages(rewards, "group")
    gaps, groups = [], []
    for seed in range(4):
        model, tok = tiny_fp64_policy(seed=seed)
        rollouts = synthetic_rollouts(tok, 4, 6, seed=seed)
        change = _one_step(model, rollouts, adv).reshape(4, 6)
        gaps.append(float(change[adv > 0].mean() - change[adv < 0].mean()))
        groups += [float(change[i][adv[i] > 0].mean() - change[i][adv[i] < 0].mean())
                   for i in range(4)]
        if seed == 0:   # the control: zero advantages (and no KL term) leave the policy as is
            still = _one_step(model, rollouts, torch.zeros_like(adv))
            assert float(still.abs().max()) == 0.0
    assert all(g > 0 for g in gaps), gaps
    assert sum(g > 0 for g in groups) >= 0.85 * len(groups), groups
