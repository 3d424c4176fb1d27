"""One batch of rows decoded with a transformers causal LM: the transformers engine's core.

:func:`decode` prefills each distinct prompt once, copies its key/value cache to that prompt's
rows (G rows share one prefill instead of recomputing it G times), then decodes one token per
live row per step:

* the cache is preallocated for ``prompt + cap`` tokens (:class:`PreallocatedLayer`): no
  ``torch.cat`` per step, and attention reads only the filled part;
* rows that finished are dropped from the batch once they are an eighth of it (their cache
  rows are compacted away), so a step costs what the live rows need;
* generation stops when every row has finished, or at the cap;
* tokens come from :func:`dpgrpo.rollout.sampling.next_tokens` with each row's own coins.

Shapes never need to be fixed ahead of time, so nothing is compiled or recompiled per round.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from dpgrpo.rollout.batch import left_pad
from dpgrpo.rollout.sampling import SamplerSettings, next_tokens

try:  # transformers >= 5: per-layer caches
    from transformers.cache_utils import DynamicCache, DynamicLayer
except ImportError:  # pragma: no cover - older transformers: plain DynamicCache
    from transformers import DynamicCache
    DynamicLayer = None

#: compact the batch once this fraction (1/COMPACT) of its rows has finished
COMPACT = 8


if DynamicLayer is not None:
    class PreallocatedLayer(DynamicLayer):
        """A full-attention layer cache allocated once for ``capacity`` positions.

        ``update`` writes the new keys/values in place and returns views of the filled part,
        so attention costs what the current length needs and nothing is concatenated.
        """

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity, self.length = capacity, 0

        def _allocate(self, like: torch.Tensor, batch: int, capacity: int) -> torch.Tensor:
            return like.new_empty((batch, like.shape[1], capacity, like.shape[3]))

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self._k = self._allocate(key_states, key_states.shape[0], self.capacity)
            self._v = self._allocate(value_states, value_states.shape[0], self.capacity)
            self.is_initialized = True

        def _view(self) -> None:
            self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[2]:  # never at the planned capacity; stay correct anyway
                self._resize(torch.arange(self._k.shape[0], device=self.device), 2 * end)
            self._k[:, :, self.length:end] = key_states
            self._v[:, :, self.length:end] = value_states
            self.length = end
            self._view()
            return self.keys, self.values

        def _resize(self, rows: torch.Tensor, capacity: int) -> None:
            k = self._allocate(self._k, len(rows), capacity)
            v = self._allocate(self._v, len(rows), capacity)
            k[:, :, :self.length] = self._k[rows, :, :self.length]
            v[:, :, :self.length] = self._v[rows, :, :self.length]
            self._k, self._v = k, v
            self._view()

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self._resize(indices, self._k.shape[2])

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized:
                rows = torch.arange(self._k.shape[0], device=self.device)
                self._resize(rows.repeat_interleave(repeats), self._k.shape[2])

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove < 0 and self.is_initialized:
                self.length = max(0, self.length + tokens_to_remove)
                self._view()

        def reset(self) -> None:
            self.length = 0
            super().reset()


def new_cache(model: Any, capacity: int) -> Any:
    """A cache for ``model`` whose full-attention layers are preallocated for ``capacity``
    positions (other layer kinds, e.g. sliding windows, keep their own transformers class)."""
    config = _base(model).config
    try:
        cache = DynamicCache(config=config)
    except TypeError:  # pragma: no cover - older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return cache
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in layers]
    return cache


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_keyword(model: Any) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values``: the forward's cache argument."""
    params = inspect.signature(_base(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def decode(model: Any, prompts: list[list[int]], row_prompt: list[int],
           coins: torch.Tensor | None, *, sampler: SamplerSettings, max_new_tokens: int,
           stop: list[int], pad_id: int) -> torch.Tensor:
    """``(R, max_new_tokens)`` generated tokens of ``R = len(row_prompt)`` rows (row ``r``
    continues ``prompts[row_prompt[r]]``); after a row's first stop token, ``pad_id``.

    ``coins`` is ``(R, max_new_tokens)`` (None when greedy). Call under ``torch.inference_mode``
    with the model in eval mode.
    """
    device = next(model.parameters()).device
    n_rows, width = len(row_prompt), max(len(p) for p in prompts)
    ids, mask = left_pad(prompts, pad_id)                                       # (B, P)
    padded = bool((mask == 0).any())
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache, key = new_cache(model, width + max_new_tokens), cache_keyword(model)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device) if padded else None,
                position_ids=positions.to(device), use_cache=True, logits_to_keep=1,
                **{key: cache})
    index = torch.tensor(row_prompt, device=device)
    logits = out.logits[:, -1][index]                                            # (R, V)
    if row_prompt != list(range(len(prompts))):
        cache.batch_select_indices(index)                 # each row gets its prompt's cache

    rows = torch.arange(n_rows, device=device)             # the batch's rows, live or not
    live = torch.ones(n_rows, dtype=torch.bool, device=device)
    pos = mask.sum(1).to(device)[index]                    # next position id of each row
    attn = None
    if padded:
        attn = torch.ones((n_rows, width + max_new_tokens), dtype=torch.long, device=device)
        attn[:, :width] = mask.to(device)[index]
    seen = None
    if sampler.repetition_penalty != 1.0:
        seen = torch.zeros((len(prompts), logits.shape[-1]), dtype=torch.bool, device=device)
        for b, prompt in enumerate(prompts):             # the prompt's own tokens, no padding
            seen[b, torch.tensor(prompt, device=device)] = True
        seen = seen[index]
    coins = coins.to(device) if coins is not None else None
    stop_t = torch.tensor(stop, device=device)
    generated = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    for step in range(max_new_tokens):
        tok = next_tokens(logits, None if coins is None else coins[rows, step], sampler, seen)
        tok = torch.where(live, tok, pad_id)
        generated[rows, step] = tok
        live &= ~torch.isin(tok, stop_t)
        n_live = int(live.sum())
        if n_live == 0 or step + 1 == max_new_tokens:
            break
        if seen is not None:
            seen[torch.arange(len(rows), device=device), tok] = True
        if (len(rows) - n_live) * COMPACT >= len(rows):    # drop finished rows
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, tok, pos, live = rows[keep], tok[keep], pos[keep], live[keep]
            attn = attn[keep] if attn is not None else None
            seen = seen[keep] if seen is not None else None
        logits = model(input_ids=tok[:, None], position_ids=pos[:, None],
                       attention_mask=attn[:, :width + step + 1] if attn is not None else None,
                       use_cache=True, **{key: cache}).logits[:, -1]
        pos = pos + 1
    return generated


__all__ = ["COMPACT", "cache_keyword", "decode", "new_cache"]
