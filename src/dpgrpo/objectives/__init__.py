"""Per-prompt objectives: what one record (a prompt with its rows) contributes to the loss.

A :class:`TrainBatch` holds B prompts with R rows each (GRPO: the G completions; SFT: the
target sequences), rows prompt-major. An :class:`Objective` maps rows to per-row losses; the
loss of prompt i is ``sum_r row_weights[i, r] * row_loss[i, r]`` (Eq. 7 with weights 1/G).
Every statistic a row loss uses (advantages, token counts) comes from its own prompt, so the
per-prompt gradient depends on that record alone (Section III-C, first remark; III-D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from dpgrpo.objectives.trunk import Trunk


@dataclass
class TrainBatch:
    """B prompts x R rows, rows prompt-major (rows i*R .. i*R+R-1 belong to prompt i)."""

    input_ids: torch.Tensor              # (B*R, L) long
    attention_mask: torch.Tensor         # (B*R, L)
    loss_mask: torch.Tensor              # (B*R, L): tokens predicted and entering the loss
    row_weights: torch.Tensor            # (B, R): per-prompt weights over its own rows
    num_prompts: int                     # B
    rows_per_prompt: int                 # R
    advantages: torch.Tensor | None = None      # (B, R), computed within each prompt
    ref_logprobs: torch.Tensor | None = None    # (B*R, L) reference-policy token log-probs
    trunk: Trunk | None = None                   # the reference pass's frozen-layer states
    # a prompt's tokens run once for its rows in each pass (one LoRA-dropout mask for them);
    # false: every row whole, one mask per row (train.share_prompt_pass)
    share_prompt: bool = True

    def __post_init__(self) -> None:
        n, r = self.num_prompts * self.rows_per_prompt, self.rows_per_prompt
        assert self.input_ids.shape[0] == n, (tuple(self.input_ids.shape), n)
        assert self.attention_mask.shape == self.input_ids.shape
        assert self.loss_mask.shape == self.input_ids.shape
        assert tuple(self.row_weights.shape) == (self.num_prompts, r)
        if self.advantages is not None:
            assert tuple(self.advantages.shape) == (self.num_prompts, r)
        if self.ref_logprobs is not None:
            assert self.ref_logprobs.shape == self.input_ids.shape

    @property
    def num_rows(self) -> int:
        return self.num_prompts * self.rows_per_prompt

    def prompt_rows(self, i: int) -> slice:
        """The rows of prompt ``i``."""
        return slice(i * self.rows_per_prompt, (i + 1) * self.rows_per_prompt)

    def columns(self, rows: slice) -> slice:
        """The columns these rows occupy (their own padding trimmed): a function of these rows
        alone, so a prompt's computation never depends on how wide its batch-mates are."""
        used = self.attention_mask[rows].bool().any(dim=0).nonzero()
        if len(used) == 0:
            return slice(0, 0)
        return slice(int(used[0]), int(used[-1]) + 1)

    def window(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                           torch.Tensor | None]:
        """(input_ids, attention_mask, loss_mask, ref_logprobs) of ``rows``, columns trimmed."""
        cols = self.columns(rows)
        ref = None if self.ref_logprobs is None else self.ref_logprobs[rows, cols]
        return (self.input_ids[rows, cols], self.attention_mask[rows, cols],
                self.loss_mask[rows, cols], ref)

    def to(self, device: torch.device | str) -> TrainBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)
        return TrainBatch(self.input_ids.to(device), self.attention_mask.to(device),
                          self.loss_mask.to(device), self.row_weights.to(device),
                          self.num_prompts, self.rows_per_prompt, move(self.advantages),
                          move(self.ref_logprobs),
                          None if self.trunk is None else self.trunk.to(device))


@runtime_checkable
class Objective(Protocol):
    """Per-row losses; each row's loss is the mean over its own ``loss_mask`` tokens."""

    def row_losses(self, model: torch.nn.Module, batch: TrainBatch,
                   rows: slice) -> torch.Tensor:
        """(len(rows),) losses in fp32 (fp64 for fp64 models), differentiable."""
        ...


def row_weights_uniform(num_prompts: int, rows_per_prompt: int,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, R) weights 1/R: the prompt loss is the mean of its row losses (Eq. 7's 1/G)."""
    return torch.full((num_prompts, rows_per_prompt), 1.0 / max(rows_per_prompt, 1),
                      dtype=dtype)


def window_logprobs(model: torch.nn.Module, batch: TrainBatch, rows: slice, *,
                    temperature: float = 1.0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-probs, loss mask, reference log-probs) of ``rows`` on their own columns
    (:meth:`TrainBatch.window`), the prompt of each prompt's rows run once for all of them;
    ``temperature``: of the tempered policy (:func:`~dpgrpo.objectives.logprobs.token_logprobs`)."""
    from dpgrpo.objectives.logprobs import token_logprobs

    ids, attn, mask, ref = batch.window(rows)                                 # (n, W)
    share = min(ids.shape[0], batch.rows_per_prompt) if batch.share_prompt else None
    return (token_logprobs(model, ids, attn, mask=mask, group_size=share, trunk=batch.trunk,
                           temperature=temperature), mask, ref)


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its own masked tokens, shape (n,); an empty row gives 0.

    The normalizer is the row's own token count, never a count shared across rows or prompts
    (a shared one would let one prompt's length scale another prompt's gradient).
    """
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


__all__ = ["Objective", "TrainBatch", "masked_row_mean", "row_weights_uniform",
           "window_logprobs"]
