"""GRPO advantages (Eq. 2), the per-token KL estimator (Eq. 3) and the per-prompt loss (Eq. 7).

Everything here is computed within one prompt's group: the mean and standard deviation of
Eq. (2) are taken over that prompt's G rewards only, and a completion's token sum is divided by
its own length (Eq. 7), by the public completion cap (Dr. GRPO) or by the token count of its own
prompt's G completions (DAPO's token-level mean, per prompt): ``train.loss_type``. No statistic
is shared across prompts, which the sensitivity bound requires (Section III-C, first remark;
Section III-D).

The objective is strictly on-policy: one gradient step per sampled batch, the importance ratio
``exp(u - sg(u))`` is exactly 1 in value, so a PPO-style ratio clip (TRL's ``epsilon``,
DAPO's ``epsilon_high``) would never bind and is not implemented (``docs/coming-from-trl.md``).
The ratio's gradient is not 1, though: ``train.kl_bias_correction`` multiplies each token's KL
estimate by it, as TRL's ``use_bias_correction_kl`` does (:class:`GRPOObjective`).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from dpgrpo.config.losses import LOSS_TYPES, refuse
from dpgrpo.errors import ConfigError
from dpgrpo.model_adapters import reference_policy
from dpgrpo.objectives import TrainBatch, masked_row_mean, row_weights_uniform, window_logprobs
from dpgrpo.objectives.logprobs import token_logprobs
from dpgrpo.objectives.trunk import Trunk

if TYPE_CHECKING:
    from dpgrpo.rollout.batch import RolloutBatch

ADVANTAGE_MODES = ("group", "zero", "shuffled", "positive")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4, *,
                     scale: bool = True) -> torch.Tensor:
    """Eq. (2): A = (r - mean) / (std + c) within each prompt's group, std with G-1.

    ``scale=False``: A = r - mean, Dr. GRPO's advantage (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", Sec. 3.1: the std divisor favours questions of very low or very
    high difficulty). rewards: (B, G) -> advantages (B, G). G = 1 gives zeros.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (B, G), got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    if rewards.shape[1] < 2 or rewards.shape[0] == 0:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)                 # (B, 1)
    if not scale:
        return rewards - mean                                # (B, G)
    std = rewards.std(dim=1, correction=1, keepdim=True)     # (B, 1), G-1 denominator
    return (rewards - mean) / (std + eps)                    # (B, G)


def compute_advantages(rewards: torch.Tensor, mode: str = "group", *,
                       generator: torch.Generator | None = None,
                       coins: torch.Tensor | None = None,
                       eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """Advantages for the training arms, (B, G) -> (B, G), each row from its own rewards.

    ``group``: Eq. (2). ``zero``: all zeros (the zero-advantage control, Section V; the KL term
    stays). ``shuffled``: rewards permuted within each group before Eq. (2), by the order of
    ``coins`` ((B, G) uniforms, row i prompt i's own: the trainer binds them to the prompt's
    round and slot), else of draws from ``generator``, else from OS entropy. ``positive``:
    A = r, unnormalized. ``scale=False`` drops Eq. (2)'s std divisor (``group``, ``shuffled``;
    ``train.scale_rewards = "none"``).
    """
    if mode not in ADVANTAGE_MODES:
        raise ConfigError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    if mode == "group":
        return group_advantages(rewards, eps, scale=scale)
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
    return group_advantages(rewards.gather(1, perm), eps, scale=scale)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Eq. (3) per-token KL estimator: exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


@dataclass(frozen=True)
class GRPOObjective:
    """Eq. (7): row loss = -(1/N) sum_k [exp(u_k - sg(u_k)) A - beta K_k], N per ``loss_type``.

    ``loss_type`` (:data:`dpgrpo.config.losses.LOSS_TYPES`; the prompt's loss is the mean of its
    G row losses):

    * ``"grpo"``: N = the completion's own length (Eq. 7; Shao et al. 2024).
    * ``"dr_grpo"``: N = ``max_completion_length``, the public completion cap, for every row
      (Liu et al. 2025, "Understanding R1-Zero-Like Training", Sec. 3.1: no length bias). With
      ``scale_rewards = "none"`` (no std in Eq. 2) this is Dr. GRPO.
    * ``"prompt_token_mean"``: N = the mean length of the prompt's own G completions, so the
      prompt's loss is its token sum over the tokens of its G completions: DAPO's token-level
      mean (Yu et al. 2025, "DAPO", Sec. 3.3) counted over ONE prompt, never the batch.

    ``temperature`` T: u_k are log-probs of the tempered policy softmax(logits / T). With T the
    sampling temperature, the policy in Eq. (7) is the one the completions were drawn from, so
    the gradient is on-policy (TRL and verl divide the logits by it too); the reference
    log-probs of Eq. (3) must then be taken at the same T (:func:`reference_logprobs`).
    ``train.tempered_logprobs`` chooses it.

    ``kl_bias_correction``: each token's K_k is multiplied by the importance ratio
    exp(u_k - sg(u_k)), 1 in value, so the loss is unchanged, but the KL term's gradient per
    token becomes beta (u_k - u_ref,k) grad u_k, the score-function gradient of the sampled
    sequence's KL, instead of Eq. (3)'s beta (1 - pi_ref/pi) grad u_k (the two agree to first
    order while the policy is near the reference). TRL's ``use_bias_correction_kl``, True by
    default in TRL 1.16. A per-token factor of the row's own log-probs: isolation holds.
    """

    beta: float = 0.04
    loss_type: str = "grpo"
    max_completion_length: int | None = None  # dr_grpo's constant: the public completion cap
    temperature: float = 1.0  # of the policy whose log-probs enter Eq. (7) and Eq. (3)
    kl_bias_correction: bool = False  # K_k * exp(u_k - sg(u_k)): TRL's use_bias_correction_kl

    def __post_init__(self) -> None:
        if not self.beta >= 0.0:
            raise ConfigError(f"beta must be >= 0, got {self.beta!r}")
        if self.loss_type not in LOSS_TYPES:
            refuse("loss_type", self.loss_type, LOSS_TYPES)
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature!r}")
        if self.loss_type == "dr_grpo" and not (self.max_completion_length or 0) >= 1:
            raise ConfigError("loss_type 'dr_grpo' divides by the completion cap: give "
                              f"max_completion_length >= 1, got {self.max_completion_length!r}")

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
        logp, mask, ref = window_logprobs(model, batch, rows,
                                          temperature=self.temperature)       # (n, W)
        mask = mask.to(logp.dtype)
        adv = batch.advantages.reshape(-1)[rows].to(logp.dtype).unsqueeze(1)  # (n, 1)
        ratio = torch.exp(logp - logp.detach())                               # 1, grad u
        gain = ratio * adv                                                    # (n, W)
        if self.beta > 0:
            assert ref is not None
            kl = k3_kl(logp, torch.where(mask > 0, ref.to(logp.dtype), logp))  # 0 off-mask
            if self.kl_bias_correction:
                kl = kl * ratio                                               # TRL's default
            gain = gain - self.beta * kl                                      # Eq. (3)
        if self.loss_type == "grpo":
            return masked_row_mean(-gain, mask)                              # (n,)
        return (-gain * mask).sum(dim=1) / self._normalizers(batch, rows, logp.dtype)

    def _normalizers(self, batch: TrainBatch, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        """(n,) divisors of the rows' token sums: the public cap (dr_grpo), or the mean
        completion length of each row's own prompt, read from that prompt's rows only."""
        n = rows.stop - rows.start
        if self.loss_type == "dr_grpo":
            cap = cast(int, self.max_completion_length)    # dr_grpo: >= 1 (__post_init__)
            return torch.full((n,), float(cap), dtype=dtype,
                              device=batch.loss_mask.device)
        r = batch.rows_per_prompt
        first, last = rows.start // r, (rows.stop - 1) // r + 1               # prompts of rows
        own = batch.loss_mask[first * r:last * r].to(dtype)                   # their rows only
        tokens = own.reshape(last - first, -1).sum(dim=1).clamp(min=1.0)     # (prompts,)
        prompt = torch.arange(rows.start, rows.stop, device=own.device) // r - first
        return tokens[prompt] / r                                             # (n,)


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


def reference_logprobs(policy_model: torch.nn.Module, rollouts: object, *,
                       batch_size: int | None = None,
                       trunk: Trunk | None = None, temperature: float = 1.0,
                       share_prompt: bool = True) -> torch.Tensor:
    """Reference-policy token log-probs (no grad): (B*G, L), Eq. (3)'s pi_ref, the policy of
    :func:`dpgrpo.model_adapters.reference_policy` (the run's start: the base, or a public
    warm start).

    ``rollouts`` is a RolloutBatch or TrainBatch. Each forward holds at most ``batch_size`` rows
    of ONE prompt on that prompt's own columns, so a prompt's reference log-probs are the same
    bits whichever prompts share its round (record isolation, A2). ``trunk``: each window's
    frozen-layer states are recorded into it, for the gradient pass (:mod:`.trunk`).
    ``temperature``: of the tempered reference policy, the objective's own (Eq. 3 compares the
    two policies at one temperature). ``share_prompt``: a prompt's tokens run once for its rows
    (``train.share_prompt_pass``); false: every row whole, as the gradient pass then does (so
    the trunk's windows match).
    """
    ids, attn, mask, per_prompt = _layout(rollouts)
    dtype = torch.promote_types(next(policy_model.parameters()).dtype, torch.float32)
    out = torch.zeros(ids.shape, dtype=dtype, device=ids.device)
    with torch.no_grad(), reference_policy(policy_model), \
            (trunk.recording() if trunk is not None else nullcontext()):
        for rows in prompt_row_chunks(ids.shape[0], per_prompt, batch_size):
            used = attn[rows].bool().any(dim=0).nonzero()
            if len(used) == 0:
                continue
            cols = slice(int(used[0]), int(used[-1]) + 1)
            out[rows, cols] = token_logprobs(policy_model, ids[rows, cols], attn[rows, cols],
                                             mask=mask[rows, cols],
                                             group_size=(rows.stop - rows.start
                                                         if share_prompt else None),
                                             trunk=trunk, temperature=temperature).to(dtype)
    return out


def build_grpo_batch(rollouts: RolloutBatch, rewards: torch.Tensor,
                     advantages: torch.Tensor | None = None,
                     ref_logprobs: torch.Tensor | None = None, *,
                     mask_truncated: bool = False, trunk: Trunk | None = None,
                     share_prompt: bool = True) -> TrainBatch:
    """TrainBatch for Eq. (7) from a RolloutBatch: loss on completion tokens, weights 1/G.

    rewards: (B, G); advantages: (B, G), default :func:`group_advantages` of ``rewards``.
    ``mask_truncated``: completions that hit the cap get no loss tokens (DAPO's overlong
    filtering, Yu et al. 2025, Sec. 3.4; TRL's ``mask_truncated_completions``): a rule on each
    row's own ``hit_cap``. ``trunk``: the reference pass's frozen-layer states (:mod:`.trunk`).
    ``share_prompt``: :attr:`TrainBatch.share_prompt` (``train.share_prompt_pass``).
    """
    b, g = rollouts.num_prompts, rollouts.group_size
    if tuple(rewards.shape) != (b, g):
        raise ValueError(f"rewards must be (B, G) = ({b}, {g}), got {tuple(rewards.shape)}")
    if advantages is None:
        advantages = group_advantages(rewards)
    if tuple(advantages.shape) != (b, g):
        raise ValueError(f"advantages must be ({b}, {g}), got {tuple(advantages.shape)}")
    loss_mask = rollouts.completion_mask
    if mask_truncated:
        loss_mask = loss_mask * (~rollouts.hit_cap.bool()).to(loss_mask.dtype).unsqueeze(1)
    return TrainBatch(input_ids=rollouts.input_ids, attention_mask=rollouts.attention_mask,
                      loss_mask=loss_mask,
                      row_weights=row_weights_uniform(b, g, advantages.dtype),
                      num_prompts=b, rows_per_prompt=g, advantages=advantages,
                      ref_logprobs=ref_logprobs, trunk=trunk, share_prompt=share_prompt)
