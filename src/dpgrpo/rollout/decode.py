"""One batch of rows decoded with a transformers causal LM: the transformers engine's core.

:func:`decode` prefills each distinct prompt once, copies its key/value cache to that prompt's
rows (G rows share one prefill instead of recomputing it G times), then decodes one token per
live row per step:

* the cache is preallocated for ``prompt + cap`` tokens (:class:`PreallocatedLayer`): no
  ``torch.cat`` per step, and attention reads only the filled part;
* rows that finished are dropped from the batch once they are an eighth of it (their cache
  rows are compacted away), so a step costs what the live rows need;
* generation stops when every row has finished, or at the cap;
* tokens come from :func:`dpgrpo.rollout.sampling.next_tokens` with each row's own coins;
* on an accelerator the host reads how many rows are live only every ``check_every`` steps
  (default :data:`CHECK_EVERY`), so the device is not drained by a synchronisation per step;
  finished rows in between produce padding, as they do in any step before compaction;
* grouped-query models decode through :mod:`dpgrpo.rollout.attention` (no ``repeat_kv``),
  and on CUDA attention avoids the cuDNN backend, which re-plans for every new length.

Shapes never need to be fixed ahead of time, so nothing is compiled or recompiled per round.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any, cast

import torch

from dpgrpo.rollout.attention import grouped_decoding
from dpgrpo.rollout.batch import left_pad
from dpgrpo.rollout.graphs import StaticStep, capture, make_static_layer
from dpgrpo.rollout.sampling import SamplerSettings, next_tokens

if TYPE_CHECKING:  # checked against transformers >= 5
    from transformers.cache_utils import DynamicCache, DynamicLayer
else:
    try:  # transformers >= 5: per-layer caches
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:  # pragma: no cover - older transformers: plain DynamicCache
        from transformers import DynamicCache
        DynamicLayer = None

#: compact the batch once this fraction (1/COMPACT) of its rows has finished
COMPACT = 8
#: steps between the host's reads of the live-row count on an accelerator (1 on the CPU)
CHECK_EVERY = 16
#: decode with constant shapes, replayed as a CUDA graph, by default on CUDA
STATIC_ON_CUDA = True


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

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
                   **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[2]:  # never at the planned capacity; stay correct anyway
                self._resize(torch.arange(self._k.shape[0], device=self.device), 2 * end)
            self._k[:, :, self.length:end] = key_states
            self._v[:, :, self.length:end] = value_states
            self.length = end
            self._view()
            # DynamicLayer types keys/values Optional: _view has just set both
            return cast(torch.Tensor, self.keys), cast(torch.Tensor, self.values)

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


StaticLayer = make_static_layer(PreallocatedLayer) if DynamicLayer is not None else type(None)


def new_cache(model: object, capacity: int, layer: type | None = None) -> DynamicCache:
    """A cache for ``model`` whose full-attention layers are preallocated for ``capacity``
    positions, as ``layer`` (default :class:`PreallocatedLayer`); other layer kinds, e.g.
    sliding windows, keep their own transformers class."""
    config = _base(model).config
    try:
        cache = DynamicCache(config=config)
    except TypeError:  # pragma: no cover - older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return cache
    kind = layer or PreallocatedLayer
    cache.layers = [kind(capacity) if type(one) is DynamicLayer else one for one in layers]
    return cache


def plain_cache(model: object) -> DynamicCache:
    """transformers' own ``DynamicCache`` for ``model`` (keys and values concatenated, so a
    forward through it can be differentiated; the preallocated layers write in place)."""
    try:
        return DynamicCache(config=_base(model).config)
    except TypeError:  # pragma: no cover - older transformers
        return DynamicCache()


def _base(model: object) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_keyword(model: object) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values``: the forward's cache argument."""
    params = inspect.signature(_base(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _decoding_kernels(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CUDA, attention without the cuDNN backend: its kernels are fast, but each new key
    length (every step) costs about 1.7 ms of host time to plan (measured on an H200, PyTorch
    2.11: half of a 95 ms decoding step of Qwen2.5-1.5B); the flash and memory-efficient
    kernels need no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, n) for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
                if hasattr(SDPBackend, n)]
    return sdpa_kernel(backends)


def decode(model: torch.nn.Module, prompts: list[list[int]], row_prompt: list[int],
           coins: torch.Tensor | None, *, sampler: SamplerSettings, max_new_tokens: int,
           stop: list[int], pad_id: int, check_every: int | None = None,
           static: bool | None = None,
           logprobs: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``(R, max_new_tokens)`` generated tokens of ``R = len(row_prompt)`` rows (row ``r``
    continues ``prompts[row_prompt[r]]``); after a row's first stop token, ``pad_id``.
    With ``logprobs``, also ``(R, max_new_tokens)`` log-probabilities of those tokens under the
    model's own distribution (log-softmax of the logits: temperature 1, no top-p, no repetition
    penalty), at least fp32; entries after a row's stop token are meaningless.

    ``coins`` is ``(R, max_new_tokens)`` (None when greedy). ``check_every``: steps between
    reads of the live-row count (default 1 on the CPU, :data:`CHECK_EVERY` elsewhere).
    ``static``: decode with constant shapes (:mod:`dpgrpo.rollout.graphs`), replayed as a CUDA
    graph on CUDA; default :data:`STATIC_ON_CUDA` on CUDA, off elsewhere. Call under
    ``torch.inference_mode`` with the model in eval mode.
    """
    device = next(model.parameters()).device
    if check_every is None:
        check_every = 1 if device.type == "cpu" else CHECK_EVERY
    if static is None:
        static = STATIC_ON_CUDA and device.type == "cuda"
    with grouped_decoding(model), _decoding_kernels(device):
        cache, logits, state = _prefill(model, device, prompts, row_prompt, pad_id,
                                        max_new_tokens, static)
        run = _decode_static if static and _all_static(cache) else _decode_dynamic
        loop = _Loop(prompts, row_prompt, logits.shape[-1], coins, sampler, max_new_tokens, stop,
                     pad_id, device, logprobs)
        run(model, device, cache, logits, state, loop, max_new_tokens, max(1, int(check_every)))
    # logp is allocated at the first step (max_new_tokens >= 1, check_request)
    return (loop.generated, cast(torch.Tensor, loop.logp)) if logprobs else loop.generated


def _all_static(cache: DynamicCache) -> bool:
    return bool(getattr(cache, "layers", None)) and all(
        isinstance(layer, StaticLayer) for layer in cache.layers)


def _prefill(
    model: torch.nn.Module,
    device: torch.device,
    prompts: list[list[int]],
    row_prompt: list[int],
    pad_id: int,
    max_new_tokens: int,
    static: bool,
) -> tuple[DynamicCache, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Prefill each distinct prompt once and give every row its prompt's cache; returns the
    cache, the rows' first logits ``(R, V)`` and ``(index, prompt mask, next positions)``."""
    width = max(len(p) for p in prompts)
    ids, mask = left_pad(prompts, pad_id)                                       # (B, P)
    padded = bool((mask == 0).any())
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = new_cache(model, width + max_new_tokens,
                      StaticLayer if static and DynamicLayer is not None else None)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device) if padded else None,
                position_ids=positions.to(device), use_cache=True, logits_to_keep=1,
                **{cache_keyword(model): cache})
    index = torch.tensor(row_prompt, device=device)
    logits = out.logits[:, -1][index]                                            # (R, V)
    if row_prompt != list(range(len(prompts))):
        cache.batch_select_indices(index)                 # each row gets its prompt's cache
    mask = mask.to(device)[index]                                                # (R, P)
    return cache, logits, (mask, mask.sum(1))


def _seen(prompts: list[list[int]], row_prompt: list[int], vocab: int, sampler: SamplerSettings,
          device: torch.device) -> torch.Tensor | None:
    """``(R, V)`` tokens already in each row (its prompt), for the repetition penalty."""
    if sampler.repetition_penalty == 1.0:
        return None
    seen = torch.zeros((len(prompts), vocab), dtype=torch.bool, device=device)
    for b, prompt in enumerate(prompts):                 # the prompt's own tokens, no padding
        seen[b, torch.tensor(prompt, device=device)] = True
    return seen[torch.tensor(row_prompt, device=device)]


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


class _Loop:
    """What both decoders share: the coins, the stop ids, the repetition-penalty table of the
    call's rows, the output, and one sampling step."""

    def __init__(self, prompts: list[list[int]], row_prompt: list[int], vocab: int,
                 coins: torch.Tensor | None, sampler: SamplerSettings, max_new_tokens: int,
                 stop: list[int], pad_id: int, device: torch.device,
                 logprobs: bool = False) -> None:
        self.sampler, self.pad_id = sampler, pad_id
        self.seen = _seen(prompts, row_prompt, vocab, sampler, device)
        self.coins = coins.to(device) if coins is not None else None
        self.stop = torch.tensor(stop, device=device)
        self.generated = torch.full((len(row_prompt), max_new_tokens), pad_id, dtype=torch.long,
                                    device=device)
        self.logprobs = logprobs
        self.logp: torch.Tensor | None = None      # (R, T), allocated at the first step

    def sample(self, logits: torch.Tensor, rows: torch.Tensor, step: int, live: torch.Tensor,
               seen: torch.Tensor | None) -> torch.Tensor:
        """Tokens of ``rows`` (the batch's rows, in order) at ``step``: each from its own coin,
        padding once a row has stopped; updates ``live`` and ``seen`` in place."""
        coins = None if self.coins is None else self.coins[rows, step]
        tok = torch.where(live, next_tokens(logits, coins, self.sampler, seen), self.pad_id)
        self.generated[rows, step] = tok
        if self.logprobs:
            z = logits.to(torch.promote_types(logits.dtype, torch.float32))
            if self.logp is None:
                self.logp = torch.zeros(self.generated.shape, dtype=z.dtype, device=z.device)
            self.logp[rows, step] = z.log_softmax(-1).gather(-1, tok[:, None]).squeeze(1)
        live &= ~torch.isin(tok, self.stop)
        if seen is not None:
            seen[torch.arange(len(rows), device=tok.device), tok] = True
        return tok


def _decode_dynamic(model: torch.nn.Module, device: torch.device, cache: DynamicCache,
                    logits: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], loop: _Loop,
                    max_new_tokens: int, check_every: int) -> None:
    """Growing views of the cache; finished rows dropped (see the module docstring)."""
    prompt_mask, pos = state
    n_rows, width = prompt_mask.shape
    key = cache_keyword(model)
    rows = torch.arange(n_rows, device=device)             # the batch's rows, live or not
    live = torch.ones(n_rows, dtype=torch.bool, device=device)
    attn = None           # (R, 1, 1, width + cap) additive mask: 0 to attend, dtype min not
    if bool((prompt_mask == 0).any()):    # passed 4-D, so transformers uses it as is (no sync)
        dtype = _model_dtype(model)
        attn = torch.zeros((n_rows, 1, 1, width + max_new_tokens), dtype=dtype, device=device)
        attn[:, 0, 0, :width].masked_fill_(prompt_mask == 0, torch.finfo(dtype).min)
    seen = loop.seen
    for step in range(max_new_tokens):
        tok = loop.sample(logits, rows, step, live, seen)
        if step + 1 == max_new_tokens:
            break
        n_live = int(live.sum()) if (step + 1) % check_every == 0 else len(rows)
        if n_live == 0:
            break
        if (len(rows) - n_live) * COMPACT >= len(rows):    # drop finished rows
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, tok, pos, live = rows[keep], tok[keep], pos[keep], live[keep]
            attn = attn[keep] if attn is not None else None
            seen = seen[keep] if seen is not None else None
        logits = model(input_ids=tok[:, None], position_ids=pos[:, None],
                       attention_mask=attn[..., :width + step + 1] if attn is not None else None,
                       use_cache=True, **{key: cache}).logits[:, -1]
        pos = pos + 1


def _decode_static(model: torch.nn.Module, device: torch.device, cache: DynamicCache,
                   logits: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], loop: _Loop,
                    max_new_tokens: int, check_every: int) -> None:
    """Constant shapes, every row to the end of the call (:mod:`dpgrpo.rollout.graphs`)."""
    prompt_mask, pos = state
    n_rows, width = prompt_mask.shape
    key = cache_keyword(model)

    def forward(tokens: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, position_ids=position, attention_mask=mask,
                     use_cache=True, **{key: cache}).logits[:, -1]

    step_fn = StaticStep(forward, cache.layers, prompt_mask, pos, width + max_new_tokens,
                         _model_dtype(model))
    advance = capture(step_fn) if device.type == "cuda" and max_new_tokens > 1 else step_fn
    rows = torch.arange(n_rows, device=device)
    live = torch.ones(n_rows, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        tok = loop.sample(logits, rows, step, live, loop.seen)
        if step + 1 == max_new_tokens:
            break
        if (step + 1) % check_every == 0 and not bool(live.any()):
            break
        step_fn.tokens.copy_(tok[:, None])
        logits = advance()


__all__ = ["CHECK_EVERY", "COMPACT", "STATIC_ON_CUDA", "StaticLayer", "cache_keyword", "decode",
           "new_cache"]
