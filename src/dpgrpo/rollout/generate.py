"""G sampled completions per prompt with ``transformers`` generate (Algorithm 1, line 4).

Randomness comes only from the ``torch.Generator`` passed in (seeded from OS entropy when it is
``None``): each generate call runs under :func:`torch.random.fork_rng` with a seed drawn from
that generator, so the global torch RNG is neither read nor advanced.

Assumption (A2), record isolation, on the rollout side: in exact arithmetic each prompt's
completions depend only on that prompt, the current weights and the sampling coins, not on
which other prompts share the batch. Batched floating-point kernels (and the padding a batch
imposes) are not guaranteed to be batch-invariant, so a prompt's realized completions may depend
on its batch mates in the last bits. The paper (Appendix A-G) states this gap and does not
measure it; ``isolated=True`` (``train.rollout_isolation = "isolated"``) generates each
prompt's group on its own, unpadded and with its own seed, to remove it, at a cost in speed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from dpgrpo.errors import ConfigError
from dpgrpo.model import Policy


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

    @property
    def num_rows(self) -> int:
        return self.num_prompts * self.group_size


def _stop_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = {int(tokenizer.eos_token_id)}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos is not None:
        ids.update(int(i) for i in config_eos)
    return sorted(ids)


def _empty(group_size: int) -> RolloutBatch:
    zeros = torch.zeros((0, 0), dtype=torch.long)
    return RolloutBatch(texts=[], input_ids=zeros, attention_mask=zeros.clone(),
                        completion_mask=zeros.clone(),
                        completion_lengths=torch.zeros(0, dtype=torch.long),
                        hit_cap=torch.zeros(0, dtype=torch.bool), group_size=group_size,
                        num_prompts=0)


def _sample_chunk(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                  temperature: float, max_new_tokens: int, stop: list[int], pad_id: int,
                  seed: int, top_p: float = 1.0, repetition_penalty: float = 1.0) -> torch.Tensor:
    """Generated tokens only, (n, T) with T <= max_new_tokens (right-padded by generate)."""
    from transformers import GenerationConfig

    greedy = temperature == 0.0
    config = GenerationConfig(
        do_sample=not greedy, temperature=None if greedy else float(temperature),
        top_k=None if greedy else 0, top_p=None if greedy else float(top_p),
        repetition_penalty=float(repetition_penalty), max_new_tokens=max_new_tokens,
        eos_token_id=stop,
        pad_token_id=pad_id,
        bos_token_id=getattr(model.config, "bos_token_id", None))
    devices = [prompt_ids.device] if prompt_ids.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                             generation_config=config)
    return out[:, prompt_ids.shape[1]:]


def generate(model: Any, tokenizer: Any, user_messages: list[str], *, group_size: int,
             temperature: float, max_new_tokens: int,
             generator: torch.Generator | None = None,
             batch_size: int | None = None, isolated: bool = False,
             seeds: list[int] | None = None, top_p: float = 1.0,
             repetition_penalty: float = 1.0) -> RolloutBatch:
    """Sample ``group_size`` completions per user message (chat template applied).

    ``model`` is a causal LM (usually the PeftModel) or a :class:`~dpgrpo.model.Policy`.

    ``temperature`` 0 means greedy. Generation stops at EOS or after ``max_new_tokens``.
    ``batch_size`` caps the rows per generate call (default: all rows at once). ``isolated``
    generates each prompt's group on its own (unpadded, its own seed, at most ``batch_size``
    rows per call): a prompt's completions then depend only on that prompt, the weights and
    its coins, never on which prompts share the round (assumption A2), at a cost in speed.
    ``seeds`` (one per prompt; default: drawn from ``generator``) fix each prompt's coins in
    isolated mode; in batched mode a call uses the seed of its first prompt. ``top_p`` < 1 and
    ``repetition_penalty`` != 1 change the sampler (the DIBA audit's option; training keeps
    the full tempered distribution, 1.0 and 1.0).
    """
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0.0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if not (0.0 < top_p <= 1.0 and repetition_penalty > 0.0):
        raise ConfigError(f"need 0 < top_p <= 1 and repetition_penalty > 0, got {top_p} and "
                          f"{repetition_penalty}")
    if isinstance(model, Policy):
        model = model.model
    if not user_messages:
        return _empty(group_size)
    if generator is None:
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))

    device = next(model.parameters()).device
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                             add_generation_prompt=True) for m in user_messages]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                    padding_side="left")
    prompt_ids = enc["input_ids"].repeat_interleave(group_size, dim=0)                # (N, P)
    prompt_mask = enc["attention_mask"].repeat_interleave(group_size, dim=0)
    n_rows = prompt_ids.shape[0]
    stop, pad_id = _stop_ids(model, tokenizer), int(tokenizer.pad_token_id)

    if seeds is None:
        seeds = [int(torch.randint(0, 2**62, (1,), generator=generator))
                 for _ in user_messages]
    if len(seeds) != len(user_messages):
        raise ConfigError(f"need one seed per prompt: {len(seeds)} seeds, "
                          f"{len(user_messages)} prompts")
    if isolated:  # each call: rows of one prompt, on that prompt's own columns
        step = min(batch_size or group_size, group_size)
        calls = [(slice(p + c, min(p + c + step, p + group_size)), True)
                 for p in range(0, n_rows, group_size) for c in range(0, group_size, step)]
    else:
        step = batch_size or n_rows
        calls = [(slice(s, s + step), False) for s in range(0, n_rows, step)]
    was_training = model.training
    model.eval()
    try:
        pieces = []
        for rows, trim in calls:
            ids, mask = prompt_ids[rows], prompt_mask[rows]
            if trim:
                first = int(mask[0].nonzero()[0])                 # the prompt's own tokens
                ids, mask = ids[:, first:], mask[:, first:]
            seed = seeds[rows.start // group_size] + rows.start % group_size
            pieces.append(_sample_chunk(
                model, ids.to(device), mask.to(device), temperature=temperature,
                max_new_tokens=max_new_tokens, stop=stop, pad_id=pad_id, seed=seed, top_p=top_p,
                repetition_penalty=repetition_penalty).cpu())
    finally:
        model.train(was_training)

    width = max(p.shape[1] for p in pieces)
    generated = torch.full((n_rows, width), pad_id, dtype=torch.long)              # (N, T)
    row = 0
    for p in pieces:
        generated[row:row + p.shape[0], :p.shape[1]] = p
        row += p.shape[0]
    return _assemble(tokenizer, prompt_ids, prompt_mask, generated, stop, pad_id,
                     group_size, len(user_messages), max_new_tokens)


def _assemble(tokenizer: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
              generated: torch.Tensor, stop: list[int], pad_id: int, group_size: int,
              num_prompts: int, max_new_tokens: int) -> RolloutBatch:
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
    return RolloutBatch(texts=texts, input_ids=input_ids, attention_mask=attention_mask,
                        completion_mask=completion_mask, completion_lengths=lengths,
                        hit_cap=~has_stop, group_size=group_size, num_prompts=num_prompts)
