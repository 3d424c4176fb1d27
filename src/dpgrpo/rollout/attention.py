"""Decoding attention for grouped-query models without repeating the key/value heads.

In a decoding step each row has one query token. Models with grouped-query attention (Qwen2.5:
12 query heads share 2 key/value heads; SmolLM2: 9 share 3) are run by older transformers'
``sdpa`` path, whenever an attention mask is present (left-padded prompts), by first repeating
every key/value head for each query head that reads it (``repeat_kv``): a copy of the whole
cache, 6x its size for Qwen2.5, written and read again in every layer at every step. For a
round's rollouts that copy, not the arithmetic, sets the step time.

:func:`grouped_decode_attention` instead views the ``H`` query heads as ``H_kv`` groups of
``H / H_kv`` queries (the same query-to-key/value-head assignment as ``repeat_kv``) and calls
scaled-dot-product attention once, each key/value head read once. It is the same function in
exact arithmetic; only the kernel's summation order can differ. Prefill (many query tokens)
and models without grouped heads go to transformers' own ``sdpa`` function unchanged.

:func:`grouped_decoding` switches a model to it for the duration of a ``with`` block, only
when the model uses ``sdpa`` (a flash-attention model keeps its kernel).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

NAME = "dpgrpo_grouped_decode"
_REGISTERED = False


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             dropout: float = 0.0, scaling: float | None = None,
                             is_causal: bool | None = None, **kwargs: Any
                             ) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query ``(B, H, Q, D)``, key and value
    ``(B, H_kv, L, D)``, mask ``(B, 1, Q, L)`` or None; returns ``((B, Q, H, D), None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, q_len, dim = query.shape
    if (q_len != 1 or groups == 1 or dropout != 0.0 or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or value.shape[-1] != dim
            or (attention_mask is not None and attention_mask.shape[1] != 1)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    grouped = query.reshape(batch, heads // groups, groups, dim)      # head i reads kv i // g
    mask = attention_mask                                             # (B, 1, 1, L) broadcasts
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask,
                                                           scale=scaling)
    return out.reshape(batch, 1, heads, dim), None


def _register() -> bool:
    """Register :data:`NAME` with transformers' attention and mask interfaces (once)."""
    global _REGISTERED
    if not _REGISTERED:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        except ImportError:  # pragma: no cover - transformers without attention interfaces
            return False
        AttentionInterface.register(NAME, grouped_decode_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _REGISTERED = True
    return True


def _config(model: object) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "config", None)


@contextlib.contextmanager
def grouped_decoding(model: object) -> Iterator[bool]:
    """Within the block, ``model``'s ``sdpa`` attention runs decoding steps through
    :func:`grouped_decode_attention`; yields whether it was switched."""
    config = _config(model)
    implementation = getattr(config, "_attn_implementation", None)
    groups = (getattr(config, "num_attention_heads", 1) or 1) // (
        getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", 1)
        or 1)
    if implementation != "sdpa" or groups <= 1 or not _register():
        yield False
        return
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = implementation


__all__ = ["NAME", "grouped_decode_attention", "grouped_decoding"]
