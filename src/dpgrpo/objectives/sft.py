"""Private supervised comparators (paper, Section VII-C; Corollary 2).

Both keep Algorithm 1's sampling, clipping, noise and accounting and replace only the per-record
gradient (lines 4-6), so they are accounted exactly like DP-GRPO at the same (q, sigma, T).

* Verifier-filtered DP-SFT: G completions from the *public base* (adapter disabled), keep those
  the verifier accepts, minimize their token-normalized negative log-likelihood averaged within
  the prompt; a prompt with none accepted contributes a zero gradient and is still a record.
* Gold DP-SFT: the negative log-likelihood of the reference target (worked solution for MATH and
  GSM8K, the four-token ``Answer: <letter>`` declaration for CommonsenseQA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dpgrpo.objectives import TrainBatch, masked_row_mean, window_logprobs
from dpgrpo.rollout.batch import Message, chat_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dpgrpo.rollout.batch import RolloutBatch


@dataclass(frozen=True)
class SFTObjective:
    """Row loss = -(1/L) sum_k log pi(y_k | x, y_<k): token-mean NLL over the row's own tokens."""

    def row_losses(self, model: torch.nn.Module, batch: TrainBatch, rows: slice) -> torch.Tensor:
        logp, mask, _ = window_logprobs(model, batch, rows)                   # (n, W)
        return masked_row_mean(-logp, mask)                                   # (n,)


def filtered_row_weights(rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) rewards -> (B, G) weights 1/k_i on the k_i accepted rows of prompt i, 0 elsewhere.

    Computed within each prompt only; a prompt with no accepted completion gets all-zero weights,
    hence a zero gradient, and stays in the batch (no data-dependent control flow).
    """
    accepted = (rewards > 0.5).to(torch.float32)                              # (B, G)
    return accepted / accepted.sum(dim=1, keepdim=True).clamp(min=1.0)       # (B, G)


def build_filtered_sft_batch(rollouts: RolloutBatch, rewards: torch.Tensor) -> TrainBatch:
    """TrainBatch for filtered DP-SFT from base-model rollouts and their verifier rewards."""
    b, g = rollouts.num_prompts, rollouts.group_size
    return TrainBatch(input_ids=rollouts.input_ids, attention_mask=rollouts.attention_mask,
                      loss_mask=rollouts.completion_mask, row_weights=filtered_row_weights(rewards),
                      num_prompts=b, rows_per_prompt=g)


def build_gold_sft_batch(tokenizer: PreTrainedTokenizerBase, user_messages: list[Message],
                         targets: list[str]) -> TrainBatch:
    """TrainBatch for gold DP-SFT: one row per prompt, chat prompt + target + EOS, loss on
    target."""
    b = len(user_messages)
    if b == 0:
        empty = torch.zeros((0, 1), dtype=torch.long)
        return TrainBatch(empty, empty, empty, torch.zeros((0, 1)), 0, 1)
    rows = []
    for message, target in zip(user_messages, targets):
        prompt = chat_text(tokenizer, message)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        t_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids, t_ids))
    width = max(len(p) + len(t) for p, t in rows)
    pad = int(tokenizer.pad_token_id)
    ids = torch.full((b, width), pad, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    loss = torch.zeros((b, width), dtype=torch.long)
    for i, (p_ids, t_ids) in enumerate(rows):  # left-pad so every row ends at the last column
        seq = p_ids + t_ids
        start = width - len(seq)
        ids[i, start:] = torch.tensor(seq)
        attn[i, start:] = 1
        loss[i, start + len(p_ids):] = 1
    return TrainBatch(ids, attn, loss, torch.ones((b, 1)), b, 1)


__all__ = [
    "SFTObjective",
    "build_filtered_sft_batch",
    "build_gold_sft_batch",
    "filtered_row_weights",
]
