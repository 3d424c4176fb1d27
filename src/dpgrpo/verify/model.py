"""Model-dependent mechanism checks for ``dpgrpo verify`` (paper, Appendix B), float64.

They run the production per-prompt gradient code on a tiny random float64 Llama with a nonzero
LoRA adapter, padded prompts and completions of unequal length.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.privacy.mechanism import privatize
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.training.grads import flat_mean_gradient, per_prompt_grads
from dpgrpo.verify.fixtures import synthetic_rollouts, tiny_fp64_policy
from dpgrpo.verify.registry import check


@lru_cache(maxsize=1)
def _setup():
    model, tok = tiny_fp64_policy()
    rollouts = synthetic_rollouts(tok, 3, 4, seed=0)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]],
                           dtype=torch.float64)
    ref = reference_logprobs(model, rollouts)
    return model, tok, rollouts, rewards, ref


def _grads(rewards: torch.Tensor, method: str = "fast", rows_per_pass: int | None = None,
           rollouts=None) -> dict[str, torch.Tensor]:
    model, _, default_rollouts, _, ref = _setup()
    rollouts = rollouts or default_rollouts
    if rollouts is not default_rollouts:
        ref = reference_logprobs(model, rollouts)
    batch = build_grpo_batch(rollouts, rewards, group_advantages(rewards), ref)
    return per_prompt_grads(model, GRPOObjective(), batch, method=method,
                            rows_per_pass=rows_per_pass)


def _max_rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-300)) for k in a)


@check("fast_equals_reference", group="model", tolerance=1e-6,
       detail="max relative difference, one-pass per-prompt gradients vs one backward per prompt")
def _fast_vs_reference() -> float:
    rewards = _setup()[3]
    return _max_rel(_grads(rewards, "fast"), _grads(rewards, "reference"))


@check("chunk_identity", group="model", tolerance=1.0,
       detail="max |chunked - unchunked| / (1e-12 + 1e-10 |unchunked|), G = 8, chunks 1, 2, 4, 8")
def _chunks() -> float:
    _, tok, _, _, _ = _setup()
    rollouts = synthetic_rollouts(tok, 2, 8, seed=3)
    rewards = torch.tensor(
        [[1.0, 0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0, 0]], dtype=torch.float64
    )
    whole = _grads(rewards, "reference", None, rollouts)
    worst = 0.0
    for size in (1, 2, 4, 8):
        part = _grads(rewards, "reference", size, rollouts)
        worst = max(
            worst,
            max(
                float(((part[k] - whole[k]).abs() / (1e-12 + 1e-10 * whole[k].abs())).max())
                for k in whole
            ),
        )
    return worst


@check(
    "cross_prompt_isolation",
    group="model",
    tolerance=0.0,
    detail="max |change| of prompt 0's gradient when all of prompt 2's rewards change (fast path)",
)
def _isolation() -> float:
    rewards = _setup()[3]
    before = _grads(rewards)
    flipped = rewards.clone()
    flipped[2] = 1.0 - flipped[2]
    after = _grads(flipped)
    changed_j = max(float((after[k][2] - before[k][2]).abs().max()) for k in before)
    if changed_j == 0.0:  # the perturbation must actually move prompt 2
        return math.inf
    return max(float((after[k][0] - before[k][0]).abs().max()) for k in before)


@check("nonprivate_equivalence", group="model", tolerance=1e-12,
       detail="max |update(q=1, sigma=0, C=inf) - flat mean gradient over all n*G sequences|")
def _nonprivate() -> float:
    model, _, rollouts, rewards, ref = _setup()
    batch = build_grpo_batch(rollouts, rewards, group_advantages(rewards), ref)
    grads = per_prompt_grads(model, GRPOObjective(), batch)
    out = privatize(grads, clip_norm=math.inf, noise_multiplier=0.0,
                    expected_batch=float(batch.num_prompts), noise=NoiseSource(seed=0))
    update = out.update                              # name -> tensor in, name -> tensor out
    flat = flat_mean_gradient(model, GRPOObjective(), batch)
    return max(float((update[k] - flat[k]).abs().max()) for k in flat)


@check(
    "constant_reward_groups_kept",
    group="model",
    tolerance=0.0,
    detail="all-correct vs all-wrong group gradients: max |difference| "
    "(must be 0, finite, nonzero)",
)
def _constant_groups() -> float:
    ones = torch.ones((3, 4), dtype=torch.float64)
    a, b = _grads(ones), _grads(torch.zeros_like(ones))
    finite = all(bool(torch.isfinite(v).all()) for v in a.values())
    nonzero = all(float(sum(v[i].pow(2).sum() for v in a.values())) > 0 for i in range(3))
    if not (finite and nonzero and all(v.shape[0] == 3 for v in a.values())):
        return math.inf
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@lru_cache(maxsize=1)
def _policy32():
    from dpgrpo.verify.fixtures import build_tiny_tokenizer, tiny_fp32_policy

    tok = build_tiny_tokenizer()
    return tiny_fp32_policy(tok), tok


@check("batchmate_isolation", group="model", tolerance=0.0,
       detail="max |change| of any prompt's fp32 gradient (fast and reference paths) and "
              "reference log-probs when a much longer prompt joins its round")
def _batchmates() -> float:
    from dpgrpo.verify.fixtures import random_specs, rollouts_from_specs

    model, tok = _policy32()
    specs, longer = random_specs(tok, 0, 3), random_specs(tok, 1, 1, long=True)
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])

    def run(spec_list, rew, method):
        rollouts = rollouts_from_specs(tok, spec_list)
        ref = reference_logprobs(model, rollouts, batch_size=2)
        batch = build_grpo_batch(rollouts, rew, group_advantages(rew), ref)
        return batch, per_prompt_grads(model, GRPOObjective(), batch, method=method,
                                       rows_per_pass=2)

    worst = 0.0
    crowded_rewards = torch.cat([rewards[:1], torch.tensor([[0.0, 1.0, 1.0]]), rewards[1:]])
    for method in ("fast", "reference"):
        a_batch, a = run(specs, rewards, method)
        b_batch, b = run([specs[0], longer[0], specs[1], specs[2]], crowded_rewards, method)
        if b_batch.input_ids.shape[1] <= a_batch.input_ids.shape[1]:
            return math.inf                    # the perturbation must widen the rows
        for i, j in ((0, 0), (1, 2), (2, 3)):
            worst = max(worst, max(float((a[k][i] - b[k][j]).abs().max()) for k in a))
            ra = a_batch.ref_logprobs[a_batch.prompt_rows(i)]
            rb = b_batch.ref_logprobs[b_batch.prompt_rows(j)]
            worst = max(worst, float((ra[ra != 0] - rb[rb != 0]).abs().max()))
    return worst
