"""GRPO advantages (Eq. 2), the per-token KL estimator (Eq. 3) and the per-prompt loss (Eq. 7).

Everything here is computed within one prompt's group: the mean and standard deviation of
Eq. (2) are taken over that prompt's G rewards only, and each completion's loss is a mean over
its own tokens. No statistic is shared across prompts, which the sensitivity bound requires
(Section III-C, first remark; Section III-D).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from dpgrpo.errors import ConfigError
from dpgrpo.objectives import TrainBatch, masked_row_mean, row_weights_uniform
from dpgrpo.objectives import window_logprobs
from dpgrpo.objectives.logprobs import token_logprobs

ADVANTAGE_MODES = ("group", "zero", "shuffled", "positive")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Eq. (2): A = (r - mean) / (std + c) within each prompt's group, std with G-1.

    rewards: (B, G) -> advantages (B, G). G = 1 gives zeros (no spread to normalize by).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (B, G), got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    if rewards.shape[1] < 2 or rewards.shape[0] == 0:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)                 # (B, 1)
    std = rewards.std(dim=1, correction=1, keepdim=True)     # (B, 1), G-1 denominator
    return (rewards - mean) / (std + eps)                    # (B, G)


def compute_advantages(rewards: torch.Tensor, mode: str = "group", *,
                       generator: torch.Generator | None = None,
                       coins: torch.Tensor | None = None,
                       eps: float = 1e-4) -> torch.Tensor:
    """Advantages for the training arms, (B, G) -> (B, G), each row from its own rewards.

    ``group``: Eq. (2). ``zero``: all zeros (the zero-advantage control, Section V; the KL term
    stays). ``shuffled``: rewards permuted within each group before Eq. (2), by the order of
    ``coins`` ((B, G) uniforms, row i prompt i's own: the trainer binds them to the prompt's
    round and slot), else of draws from ``generator``, else from OS entropy. ``positive``:
    A = r, unnormalized.
    """
    if mode not in ADVANTAGE_MODES:
        raise ConfigError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    if mode == "group":
        return group_advantages(rewards, eps)
    if mode == "zero":
        return torch.zeros_like(rewards)
    if mode == "positive":
        return rewards.clone()
    if coins is not None:
        if tuple(coins.shape) != tuple(rewards.shape):
            raise ConfigError(f"shuffle coins {tuple(coins.shape)} for rewards "
                              f"{tuple(rewards.shape)}")
        keys = coins
    else:
        if generator is None:
            generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        keys = torch.rand(rewards.shape, generator=generator)               # (B, G)
    perm = keys.argsort(dim=1).to(rewards.device)                            # within each row
    return group_advantages(rewards.gather(1, perm), eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Eq. (3) per-token KL estimator: exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


@dataclass(frozen=True)
class GRPOObjective:
    """Eq. (7): row loss = -(1/L) sum_k [exp(u_k - sg(u_k)) A - beta K_k], token mean per row."""

    beta: float = 0.04

    def __post_init__(self) -> None:
        if not self.beta >= 0.0:
            raise ConfigError(f"beta must be >= 0, got {self.beta!r}")

    def row_losses(self, model: torch.nn.Module, batch: TrainBatch,
                   rows: slice) -> torch.Tensor:
        """(len(rows),) per-completion losses of Eq. (7), before the 1/G row weights.

        The rows are computed on their own columns (:meth:`TrainBatch.window`), so the losses
        of one prompt's rows do not depend on the widths of other prompts' rows.
        """
        if batch.advantages is None:
            raise ValueError("GRPOObjective needs batch.advantages (see build_grpo_batch)")
        if self.beta > 0 and batch.ref_logprobs is None:
            raise ValueError("GRPOObjective with beta > 0 needs batch.ref_logprobs")
        logp, mask, ref = window_logprobs(model, batch, rows)                 # (n, W)
        mask = mask.to(logp.dtype)
        adv = batch.advantages.reshape(-1)[rows].to(logp.dtype).unsqueeze(1)  # (n, 1)
        gain = torch.exp(logp - logp.detach()) * adv                          # (n, W)
        if self.beta > 0:
            assert ref is not None
            kl = k3_kl(logp, torch.where(mask > 0, ref.to(logp.dtype), logp))  # 0 off-mask
            gain = gain - self.beta * kl                                      # Eq. (3)
        return masked_row_mean(-gain, mask)                                  # (n,)


def _layout(rows: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(input_ids, attention_mask, scored-token mask, rows per prompt) of a rollout/train batch."""
    mask = getattr(rows, "completion_mask", None)
    if mask is None:
        mask = rows.loss_mask
    per_prompt = getattr(rows, "group_size", None) or rows.rows_per_prompt
    return rows.input_ids, rows.attention_mask, mask, int(per_prompt)


def prompt_row_chunks(num_rows: int, rows_per_prompt: int,
                      rows_per_pass: int | None) -> list[slice]:
    """Row slices of at most ``rows_per_pass`` rows that never cross a prompt boundary."""
    step = max(1, min(rows_per_pass or rows_per_prompt, rows_per_prompt))
    return [slice(p + c, min(p + c + step, p + rows_per_prompt))
            for p in range(0, num_rows, rows_per_prompt)
            for c in range(0, rows_per_prompt, step)]


def reference_logprobs(policy_model: torch.nn.Module, rollouts: Any, *,
                       batch_size: int | None = None) -> torch.Tensor:
    """Reference-policy token log-probs (adapter disabled, no grad): (B*G, L), Eq. (3)'s pi_ref.

    ``rollouts`` is a RolloutBatch or TrainBatch. Each forward holds at most ``batch_size`` rows
    of ONE prompt on that prompt's own columns, so a prompt's reference log-probs are the same
    bits whichever prompts share its round (record isolation, A2).
    """
    ids, attn, mask, per_prompt = _layout(rollouts)
    dtype = torch.promote_types(next(policy_model.parameters()).dtype, torch.float32)
    out = torch.zeros(ids.shape, dtype=dtype, device=ids.device)
    disable = getattr(policy_model, "disable_adapter", None)
    with torch.no_grad(), (disable() if disable is not None else nullcontext()):
        for rows in prompt_row_chunks(ids.shape[0], per_prompt, batch_size):
            used = attn[rows].bool().any(dim=0).nonzero()
            if len(used) == 0:
                continue
            cols = slice(int(used[0]), int(used[-1]) + 1)
            out[rows, cols] = token_logprobs(policy_model, ids[rows, cols], attn[rows, cols],
                                             mask=mask[rows, cols],
                                             group_size=rows.stop - rows.start).to(dtype)
    return out


def build_grpo_batch(rollouts: Any, rewards: torch.Tensor,
                     advantages: torch.Tensor | None = None,
                     ref_logprobs: torch.Tensor | None = None) -> TrainBatch:
    """TrainBatch for Eq. (7) from a RolloutBatch: loss on completion tokens, weights 1/G.

    rewards: (B, G); advantages: (B, G), default :func:`group_advantages` of ``rewards``.
    """
    b, g = rollouts.num_prompts, rollouts.group_size
    if tuple(rewards.shape) != (b, g):
        raise ValueError(f"rewards must be (B, G) = ({b}, {g}), got {tuple(rewards.shape)}")
    if advantages is None:
        advantages = group_advantages(rewards)
    if tuple(advantages.shape) != (b, g):
        raise ValueError(f"advantages must be ({b}, {g}), got {tuple(advantages.shape)}")
    return TrainBatch(input_ids=rollouts.input_ids, attention_mask=rollouts.attention_mask,
                      loss_mask=rollouts.completion_mask,
                      row_weights=row_weights_uniform(b, g, advantages.dtype),
                      num_prompts=b, rows_per_prompt=g, advantages=advantages,
                      ref_logprobs=ref_logprobs)
