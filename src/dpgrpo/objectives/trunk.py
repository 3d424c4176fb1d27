"""The frozen trunk's states, computed once per window for the reference and gradient passes.

With LoRA on the top layers only (the CPU study: the last 6 of SmolLM2's 30), the layers below
the lowest adapted one compute the same function in every pass of a round: the reference
policy and the policy differ only above it. A round computes them twice per prompt, once in
the reference pass (no grad) and once in the gradient pass, about a fifth of a DP-GRPO round
on CPU (bench/README.md, "The frozen trunk, once"). :class:`Trunk` keeps what the reference pass
computed at the input of that layer and hands it to the gradient pass of the same window.

Record isolation (A2): a state is keyed by everything its computation read (the window's
tokens, mask, scored positions and group size, and the index of the decoder call within the
window), so a window can only ever replay states computed from exactly its own inputs. A
round's trunk records every window of its reference pass (a fixed rule, no budget shared by
the batch). The values equal recomputing up to float rounding (the reference pass runs its
prompt cache preallocated, the gradient pass concatenates; tests/objectives/test_trunk.py
bounds the difference; on SmolLM2 in fp32 the released adapters were the same bits). Gold
SFT's kept trunk records and replays in the same kind of pass, so a replayed state is the
bits that pass would compute: its memory cap changes a round's time, not its values.
Replaying skips the lower layers' own calls; each skipped layer still writes a one-wide
placeholder into a transformers ``DynamicLayer`` cache, so the mask sizes and sequence length
the decoder reads from its cache stay right. A cache of any other kind, a layer that does not
return a plain tensor, or a window that was not recorded runs the full decoder instead.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

_CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")


def _digest(t: torch.Tensor | None) -> tuple[object, ...]:
    if t is None:
        return (None,)
    data = t.detach().to("cpu").contiguous()
    return (tuple(data.shape), str(data.dtype),
            hashlib.blake2b(data.numpy().tobytes(), digest_size=16).digest())


class Trunk:
    """States at the input of decoder layer ``layer`` (the lowest adapted one), per window.

    :meth:`recording` marks the passes whose windows are stored (the reference pass); any
    other pass given this trunk replays a stored window and computes the rest in full.
    ``keep_bytes`` > 0 makes a trunk that records in every pass and lives across rounds, up
    to that many bytes of states (gold SFT: a record's window is the same in every round it
    is sampled, so its frozen layers run once per run). Whether a window was kept changes a
    round's time only: a kept state is what that pass computes (tests/objectives/test_trunk.py).
    """

    def __init__(self, layer: int, *, keep_bytes: int = 0) -> None:
        if layer < 1:
            raise ValueError(f"a trunk needs at least one frozen layer below it, got {layer}")
        self.layer, self.keep_bytes = layer, keep_bytes
        self._states: dict[tuple[object, ...], list[torch.Tensor]] = {}
        self._recording = False
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._states)

    @property
    def is_recording(self) -> bool:
        return self._recording or self.bytes < self.keep_bytes

    @contextlib.contextmanager
    def recording(self) -> Iterator[Trunk]:
        self._recording = True
        try:
            yield self
        finally:
            self._recording = False

    def to(self, device: torch.device | str) -> Trunk:
        """This trunk with its states moved to ``device`` (the same object: a trunk kept across
        rounds goes on recording into it)."""
        self._states = {k: [t.to(device) for t in v] for k, v in self._states.items()}
        return self

    @contextlib.contextmanager
    def window(self, decoder: torch.nn.Module, input_ids: torch.Tensor,
               attention_mask: torch.Tensor, want: torch.Tensor,
               group_size: int | None) -> Iterator[_Window]:
        """The decoder calls of one window (:func:`token_logprobs`'s inputs), in order."""
        key = (_digest(input_ids), _digest(attention_mask), _digest(want), group_size)
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, torch.nn.ModuleList) or len(layers) <= self.layer:
            yield _Window(decoder, None, None, None)
            return
        stored = self._states.get(key)
        record: list[torch.Tensor] | None = [] if self.is_recording and stored is None else None
        win = _Window(decoder, layers[: self.layer], stored, record)
        yield win
        if record is not None and win.complete and win.calls:
            self._states[key] = record
            self.bytes += sum(t.numel() * t.element_size() for t in record)


class _Window:
    def __init__(self, decoder: torch.nn.Module, lower: torch.nn.ModuleList | None,
                 stored: list[torch.Tensor] | None, record: list[torch.Tensor] | None) -> None:
        self.decoder, self.lower, self.stored, self.record = decoder, lower, stored, record
        self.calls, self.complete = 0, record is not None

    def __call__(self, **kwargs: object) -> object:
        """``decoder(**kwargs)``, the frozen layers replayed or recorded where they can be."""
        i, self.calls = self.calls, self.calls + 1
        if self.lower is not None and self.stored is not None and i < len(self.stored) \
                and _plain_cache(kwargs):
            return self._replay(self.lower, self.stored[i], kwargs)
        if self.lower is None or self.record is None:
            return self.decoder(**kwargs)
        seen: list[object] = []
        handle = self.lower[-1].register_forward_hook(lambda _m, _a, out: seen.append(out))
        try:
            out = self.decoder(**kwargs)
        finally:
            handle.remove()
        if len(seen) == 1 and isinstance(seen[0], torch.Tensor):
            self.record.append(seen[0].detach())
        else:
            self.complete = False
        return out

    def _replay(self, lower: torch.nn.ModuleList, state: torch.Tensor,
                kwargs: Mapping[str, object]) -> Any:
        if any("forward" in vars(layer) for layer in lower):   # already wrapped (accelerate)
            return self.decoder(**kwargs)
        for index, layer in enumerate(lower):
            last = index == len(lower) - 1
            layer.forward = _skip(_layer_index(layer, index), state if last else None)
        try:
            return self.decoder(**kwargs)
        finally:
            for layer in lower:
                vars(layer).pop("forward", None)       # the class's forward again


def _plain_cache(kwargs: Mapping[str, object]) -> bool:
    """No cache, or transformers' plain ``DynamicCache`` of ``DynamicLayer`` s."""
    cache = next((kwargs[k] for k in _CACHE_KEYWORDS if kwargs.get(k) is not None), None)
    if cache is None:
        return True
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - older transformers
        return False
    layers = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _layer_index(layer: torch.nn.Module, default: int) -> int:
    return int(getattr(getattr(layer, "self_attn", None), "layer_idx", default))


def _skip(layer_index: int, state: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    """A skipped layer's forward: a one-wide cache placeholder, then the recorded state (the
    layer just below the adapted ones) or its input unchanged (the layers under that)."""

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        cache = next((kwargs[k] for k in _CACHE_KEYWORDS if kwargs.get(k) is not None), None)
        if cache is not None:
            b, t = hidden_states.shape[:2]
            mark = hidden_states.new_zeros((b, 1, t, 1))
            cache.update(mark, mark, layer_index)
        if state is None:
            return hidden_states
        if state.shape != hidden_states.shape:
            raise RuntimeError(f"trunk state {tuple(state.shape)} does not fit the window's "
                               f"{tuple(hidden_states.shape)}")
        return state

    return forward


__all__ = ["Trunk"]
