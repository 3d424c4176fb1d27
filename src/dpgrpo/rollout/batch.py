"""The completion format every rollout engine returns: :class:`RolloutBatch`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RolloutBatch:
    """B prompts x G completions, rows prompt-major (rows i*G .. i*G+G-1 are prompt i).

    Each row of ``input_ids`` is ``[left padding][prompt][completion][right padding]``; every
    prompt ends at the same column, so completions start at the same column.
    """

    texts: list[list[str]]             # B x G decoded completions, special tokens stripped
    input_ids: torch.Tensor            # (B*G, L) long
    attention_mask: torch.Tensor       # (B*G, L) long: prompt and completion tokens
    completion_mask: torch.Tensor      # (B*G, L) long: completion tokens incl. the final EOS
    completion_lengths: torch.Tensor   # (B*G,) long
    hit_cap: torch.Tensor              # (B*G,) bool: no EOS within max_new_tokens
    group_size: int
    num_prompts: int
    #: (B*G, L) log-probabilities of the completion tokens under the sampling policy's own
    #: distribution (temperature 1), zero elsewhere; only from an engine asked to record them
    logprobs: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.num_prompts * self.group_size


def empty_batch(group_size: int) -> RolloutBatch:
    """The rollouts of a round without prompts (an empty Poisson sample)."""
    zeros = torch.zeros((0, 0), dtype=torch.long)
    return RolloutBatch(texts=[], input_ids=zeros, attention_mask=zeros.clone(),
                        completion_mask=zeros.clone(),
                        completion_lengths=torch.zeros(0, dtype=torch.long),
                        hit_cap=torch.zeros(0, dtype=torch.bool), group_size=group_size,
                        num_prompts=0)


def stop_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS and the model's generation EOS."""
    ids = {int(tokenizer.eos_token_id)}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos is not None:
        ids.update(int(i) for i in config_eos)
    return sorted(ids)


#: A prompt as a task renders it: one user message, or a conversation (TRL's conversational
#: format: ``{"role", "content"}`` messages ending with a user or an assistant turn).
Message = str | Sequence[Mapping[str, str]]


def chat_messages(message: Message) -> list[dict[str, str]]:
    """The conversation of a prompt: a string is one user turn; a conversation is kept."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in message]


def chat_text(tokenizer: Any, message: Message) -> str:
    """The prompt under the tokenizer's chat template, as TRL's ``apply_chat_template`` does:
    a generation prompt after a final user turn; a final assistant turn is continued."""
    messages = chat_messages(message)
    if messages and messages[-1]["role"] == "assistant":
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, user_messages: Sequence[Message]
) -> list[list[int]]:
    """Token ids of each prompt under the chat template (:func:`chat_text`)."""
    texts = [chat_text(tokenizer, m) for m in user_messages]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def completion_ids(batch: RolloutBatch, prompt: int) -> list[list[int]]:
    """The completion token ids of prompt ``prompt``'s G rows (the final EOS included), as
    TRL passes them to reward functions (``completion_ids``)."""
    rows = range(prompt * batch.group_size, (prompt + 1) * batch.group_size)
    return [batch.input_ids[r][batch.completion_mask[r].bool()].tolist() for r in rows]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of shape (n, max length), each sequence right-aligned."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq):] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[i, width - len(seq):] = 1
    return ids, mask


def assemble(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    generated: torch.Tensor,
    stop: list[int],
    pad_id: int,
    group_size: int,
    num_prompts: int,
    max_new_tokens: int,
    logprobs: torch.Tensor | None = None,
) -> RolloutBatch:
    """Build the batch from left-padded prompt rows ``(N, P)`` and generated tokens ``(N, T)``
    (anything after a row's first stop token is ignored), with their log-probabilities
    ``(N, T)`` when given."""
    n_rows, width = generated.shape
    is_stop = torch.isin(generated, torch.tensor(stop))                           # (N, T)
    has_stop = is_stop.any(dim=1)                                                  # (N,)
    first_stop = torch.where(has_stop, is_stop.int().argmax(dim=1), width)        # (N,)
    lengths = torch.where(has_stop, first_stop + 1, first_stop).clamp(max=max_new_tokens)
    cols = torch.arange(width).unsqueeze(0)                                        # (1, T)
    comp_mask = (cols < lengths.unsqueeze(1)).long()                               # (N, T)
    keep = int(lengths.max()) if n_rows else 0
    comp_ids = torch.where(comp_mask.bool(), generated, pad_id)[:, :keep]
    comp_mask = comp_mask[:, :keep]

    input_ids = torch.cat([prompt_ids, comp_ids], dim=1)                           # (N, L)
    attention_mask = torch.cat([prompt_mask, comp_mask], dim=1)
    completion_mask = torch.cat([torch.zeros_like(prompt_mask), comp_mask], dim=1)
    decoded = tokenizer.batch_decode([ids[:n].tolist() for ids, n in zip(comp_ids, lengths)],
                                     skip_special_tokens=True)
    texts = [decoded[i * group_size:(i + 1) * group_size] for i in range(num_prompts)]
    if logprobs is not None:
        logprobs = torch.cat([torch.zeros(prompt_mask.shape, dtype=logprobs.dtype),
                              torch.where(comp_mask.bool(), logprobs[:, :keep].cpu(), 0.0)], dim=1)
    return RolloutBatch(texts=texts, input_ids=input_ids, attention_mask=attention_mask,
                        completion_mask=completion_mask, completion_lengths=lengths,
                        hit_cap=~has_stop, group_size=group_size, num_prompts=num_prompts,
                        logprobs=logprobs)


__all__ = ["Message", "RolloutBatch", "assemble", "chat_messages", "chat_prompt_ids", "chat_text",
           "completion_ids", "empty_batch", "left_pad", "stop_ids"]
