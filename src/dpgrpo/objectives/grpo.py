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
from dpgrpo.objectives import TrainBatch, row_weights_uniform

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
                       eps: float = 1e-4) -> torch.Tensor:
    """Advantages for the training arms, (B, G) -> (B, G), each row from its own rewards.

    ``group``: Eq. (2). ``zero``: all zeros (the zero-advantage control, Section V; the KL term
    stays). ``shuffled``: rewards permuted within each group (coins from ``generator``, or OS
    entropy) before Eq. (2). ``positive``: A = r, unnormalized.
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
    if generator is None:
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
    keys = torch.rand(rewards.shape, generator=generator)                   # (B, G)
    perm = keys.argsort(dim=1).to(rewards.device)                            # within each row
    return group_advantages(rewards.gather(1, perm), eps)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, *, first: int = 1) -> torch.Tensor:
    """log pi(token_k | prefix) for k >= ``first``, zeros before; (N, L) -> (N, L).

    Position 0 has no prefix and is always 0. Position ids follow the attention mask, so a
    left-padded row sees the same positions as when it was generated. Only the logits of
    positions ``first-1 .. L-2`` are computed (``logits_to_keep``); fp32 or better.
    """
    n, length = input_ids.shape
    first = max(int(first), 1)
    param = next(model.parameters())
    out_dtype = torch.promote_types(param.dtype, torch.float32)
    if n == 0 or first >= length:
        return torch.zeros((n, length), dtype=out_dtype, device=input_ids.device)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)      # (N, L)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids, logits_to_keep=length - first + 1).logits
    logits = logits[:, :-1].to(out_dtype)                                    # (N, L-first, V)
    targets = input_ids[:, first:].unsqueeze(-1)                             # (N, L-first, 1)
    logp = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(logp, (first, 0))                         # (N, L)


def first_loss_column(loss_mask: torch.Tensor) -> int:
    """First column where any row has a loss token (0 if none): logits before it are unused."""
    cols = loss_mask.bool().any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else loss_mask.shape[1]


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
        """(len(rows),) per-completion losses of Eq. (7), before the 1/G row weights."""
        if batch.advantages is None:
            raise ValueError("GRPOObjective needs batch.advantages (see build_grpo_batch)")
        if self.beta > 0 and batch.ref_logprobs is None:
            raise ValueError("GRPOObjective with beta > 0 needs batch.ref_logprobs")
        mask = batch.loss_mask[rows]                                          # (n, L)
        logp = token_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows],
                              first=first_loss_column(mask))                  # (n, L)
        mask = mask.to(logp.dtype)
        adv = batch.advantages.reshape(-1)[rows].to(logp.dtype).unsqueeze(1)  # (n, 1)
        gain = torch.exp(logp - logp.detach()) * adv                          # (n, L)
        if self.beta > 0:
            ref = batch.ref_logprobs[rows].to(logp.dtype)                     # (n, L)
            delta = torch.where(mask > 0, ref - logp, torch.zeros_like(logp))
            gain = gain - self.beta * (torch.exp(delta) - delta - 1.0)       # Eq. (3)
        per_token = -gain * mask                                              # (n, L)
        return per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)          # (n,)


def _rows_of(rollouts: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mask = getattr(rollouts, "completion_mask", None)
    if mask is None:
        mask = rollouts.loss_mask
    return rollouts.input_ids, rollouts.attention_mask, mask


def reference_logprobs(policy_model: torch.nn.Module, rollouts: Any, *,
                       batch_size: int | None = None) -> torch.Tensor:
    """Reference-policy token log-probs (adapter disabled, no grad): (B*G, L), Eq. (3)'s pi_ref.

    ``rollouts`` is a RolloutBatch or TrainBatch; ``batch_size`` caps rows per forward.
    """
    ids, attn, mask = _rows_of(rollouts)
    step = batch_size or max(ids.shape[0], 1)
    disable = getattr(policy_model, "disable_adapter", None)
    parts = []
    with torch.no_grad(), (disable() if disable is not None else nullcontext()):
        for s in range(0, ids.shape[0], step):
            parts.append(token_logprobs(policy_model, ids[s:s + step], attn[s:s + step],
                                        first=first_loss_column(mask[s:s + step])))
    if not parts:
        dtype = torch.promote_types(next(policy_model.parameters()).dtype, torch.float32)
        return torch.zeros(ids.shape, dtype=dtype)
    return torch.cat(parts, dim=0)


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
