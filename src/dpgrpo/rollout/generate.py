"""G sampled completions per prompt (Algorithm 1, line 4): the function everyone can call.

:func:`generate` runs the transformers rollout engine
(:class:`~dpgrpo.rollout.transformers_engine.TransformersEngine`): prompts prefilled once per
group, a preallocated cache, finished rows dropped, per-prompt coins. :func:`hf_generate` is
the previous loop over ``transformers`` ``model.generate`` (one call per row batch, G prefills
per prompt), kept as the reference the benchmark (``bench/rollout.py``) and tests compare with.

Randomness comes only from the per-prompt seeds, drawn from the ``torch.Generator`` passed in
(256 fresh bits of OS entropy per prompt when it is ``None``): the global torch RNG is neither
read nor advanced.

Assumption (A2), record isolation, on the rollout side: in exact arithmetic each prompt's
completions depend only on that prompt, the current weights and the sampling coins, not on
which other prompts share the batch. Batched floating-point kernels (and the padding a batch
imposes) are not guaranteed to be batch-invariant, so a prompt's realized completions may depend
on its batch mates in the last bits. The paper (Appendix A-G) states this gap and does not
measure it; ``isolated=True`` (``train.rollout_isolation = "isolated"``) generates each
prompt's group on its own, unpadded and with its own seed, to remove it, at a cost in speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dpgrpo.model import Policy
from dpgrpo.rollout.batch import (
    Message,
    RolloutBatch,
    assemble,
    chat_prompt_ids,
    empty_batch,
    left_pad,
    stop_ids,
)
from dpgrpo.rollout.engine import check_request, prompt_seeds, request_seed
from dpgrpo.rollout.sampling import SamplerSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def generate(model: torch.nn.Module | Policy, tokenizer: PreTrainedTokenizerBase,
             user_messages: list[Message], *, group_size: int,
             temperature: float, max_new_tokens: int,
             generator: torch.Generator | None = None,
             batch_size: int | None = None, isolated: bool = False,
             seeds: list[int] | None = None, top_p: float = 1.0,
             repetition_penalty: float = 1.0) -> RolloutBatch:
    """Sample ``group_size`` completions per user message (chat template applied).

    ``model`` is a causal LM (usually the PeftModel) or a :class:`~dpgrpo.model.Policy`.
    ``temperature`` 0 means greedy. Generation stops at EOS or after ``max_new_tokens``.
    ``batch_size`` caps the rows per batch (default: all rows at once). ``isolated``
    generates each prompt's group on its own (unpadded, at most ``batch_size`` rows per call):
    a prompt's completions then depend only on that prompt, the weights and its coins, never
    on which prompts share the round (assumption A2), at a cost in speed. ``seeds`` (one per
    prompt; default: drawn from ``generator``) fix each prompt's coins in either mode.
    ``top_p`` < 1 and ``repetition_penalty`` != 1 change the sampler (the DIBA audit's
    option; training keeps the full tempered distribution, 1.0 and 1.0).
    """
    from dpgrpo.rollout.transformers_engine import TransformersEngine

    if isinstance(model, Policy):
        model = model.model
    check_request(group_size, max_new_tokens, batch_size)
    engine = TransformersEngine(model, tokenizer, isolated=isolated, rows_per_call=batch_size)
    return engine.generate(user_messages, group_size=group_size, temperature=temperature,
                           max_new_tokens=max_new_tokens, seeds=seeds, generator=generator,
                           top_p=top_p, repetition_penalty=repetition_penalty)


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


def hf_generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    user_messages: list[Message],
    *,
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    batch_size: int | None = None,
    isolated: bool = False,
    seeds: list[int] | None = None,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
) -> RolloutBatch:
    """Today's reference loop: ``model.generate`` per row batch (the benchmark's baseline).

    Same arguments and output format as :func:`generate`. Every row re-runs its prompt's
    prefill; a batch runs until its longest row ends; in batched mode a call samples all its
    rows from the seed of its first prompt (so a prompt's coins depend on its batch-mates).
    """
    check_request(group_size, max_new_tokens, batch_size)
    SamplerSettings(temperature, top_p, repetition_penalty)
    if isinstance(model, Policy):
        model = model.model
    if not user_messages:
        return empty_batch(group_size)
    seeds = prompt_seeds(seeds, generator, len(user_messages))

    device = next(model.parameters()).device
    stop, pad_id = stop_ids(model, tokenizer), int(tokenizer.pad_token_id)
    prompt_ids, prompt_mask = left_pad(chat_prompt_ids(tokenizer, user_messages), pad_id)
    prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)                     # (N, P)
    prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
    n_rows = prompt_ids.shape[0]
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
            seed = request_seed(seeds[rows.start // group_size], rows.start % group_size)
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
    return assemble(tokenizer, prompt_ids, prompt_mask, generated, stop, pad_id,
                    group_size, len(user_messages), max_new_tokens)


__all__ = ["generate", "hf_generate"]
