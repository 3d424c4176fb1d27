"""Chosen-token log-probabilities without full-vocabulary logits (memory-bounded Eq. 3 and 7).

The GRPO ratio, the k3 KL term, the SFT likelihood, the audit's scores and evaluation all need
``log pi(y_k | x, y_<k)`` of the tokens actually present, never the whole distribution. Running
the model's ``lm_head`` over every position materialises an ``(N, L, V)`` tensor (about 300 GB
for the MATH preset: 1,024 rows x 1,024 tokens x 151,936 vocabulary entries x 2 bytes), and
autograd keeps it for backward. Here the decoder returns hidden states, only the positions that
are scored are gathered, and the head + log-softmax + gather runs over chunks of those tokens
inside one autograd function (as Liger-Kernel's fused linear cross-entropy and TRL's selective
log-softmax do). The forward also forms d log p / d h for each scored token, so backward is a
row scaling and nothing of size ``chunk x V`` outlives its chunk: memory is
``O(chunk x V + K x H)`` for K scored tokens, not ``O(N x L x V)``.

The head may be tied to the input embedding; it is frozen (LoRA adapts the projections only).
Gemma-style final logit soft-capping is honoured, and a ``temperature`` T scores the tempered
policy (logits / T after any cap), the distribution completions sampled at T were drawn from.
Logits are formed in the head's dtype and upcast to fp32 (fp64 for fp64 models) exactly as
``model(...).logits.float()`` would be, so the values equal the unfused computation up to the
order of the vocabulary reduction.

The G completions of one prompt share its tokens: given ``group_size``, the prompt runs once and
its key/value cache is extended by each completion, as decoding does (the reference pass and
the gradient pass then cost about what the completions need; ``bench/prompt_sharing.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, cast

import torch

from dpgrpo.errors import ConfigError
from dpgrpo.objectives.trunk import Trunk

#: entries of one ``chunk x V`` logits buffer (128 MB in fp32): bounds the head's working set
DEFAULT_LOGIT_ELEMENTS = 1 << 25


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits of a chunk in the compute dtype, (k, H) -> (k, V), and tanh(z / cap) if capped."""
    z = torch.nn.functional.linear(h, weight, bias).to(_compute_dtype(h.dtype))
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return softcap * t, t


class _ChosenLogProb(torch.autograd.Function):
    """log_softmax(head(h) / T)[target] over chunks of rows; gradient with respect to ``h``."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk: int, softcap: float | None,
                temperature: float) -> torch.Tensor:
        k = hidden.shape[0]
        out = torch.empty(k, dtype=_compute_dtype(hidden.dtype), device=hidden.device)
        need_grad = ctx.needs_input_grad[0]
        jac = torch.empty_like(hidden) if need_grad else None                 # (K, H)
        for s in range(0, k, chunk):
            h, tgt = hidden[s:s + chunk], targets[s:s + chunk]
            z, t = _chunk_logits(h, weight, bias, softcap)                    # (k, V)
            if temperature != 1.0:
                z.div_(temperature)                                           # tempered policy
            lse = torch.logsumexp(z, dim=-1)                                  # (k,)
            out[s:s + chunk] = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse
            if jac is not None:                                               # need_grad
                dz = torch.exp(z.sub_(lse.unsqueeze(-1))).neg_()              # -softmax
                dz.scatter_add_(-1, tgt.unsqueeze(-1), torch.ones_like(lse).unsqueeze(-1))
                if t is not None:
                    dz.mul_(1.0 - t * t)                                      # d cap*tanh(z/cap)
                if temperature != 1.0:
                    dz.div_(temperature)                                      # d (z / T)
                jac[s:s + chunk] = dz.to(weight.dtype) @ weight               # (k, H)
            del z, t
        if need_grad:
            ctx.save_for_backward(jac)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[object, ...]:
        (jac,) = ctx.saved_tensors
        grad_h = jac * grad_out.to(jac.dtype).unsqueeze(-1)                   # (K, H)
        return grad_h, None, None, None, None, None, None


def chosen_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                    bias: torch.Tensor | None = None, softcap: float | None = None,
                    chunk: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax((hidden @ weight.T + bias) / temperature)[targets]``, (K, H) -> (K,).

    ``chunk`` rows of logits exist at a time (default: :data:`DEFAULT_LOGIT_ELEMENTS` / V).
    Differentiable with respect to ``hidden``; the head (``weight``, ``bias``) must be frozen.
    """
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ConfigError("chunked log-probs need a frozen lm_head; adapting lm_head is not "
                          "supported (remove it from model.target_modules)")
    if not temperature > 0:
        raise ConfigError(f"log-prob temperature must be > 0, got {temperature!r}")
    size = chunk or max(1, DEFAULT_LOGIT_ELEMENTS // weight.shape[0])
    return _ChosenLogProb.apply(hidden, weight, bias, targets, size, softcap, float(temperature))


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_and_head(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, torch.nn.Module, float | None]:
    """The causal LM's decoder (returns hidden states), its ``lm_head`` and its soft-cap.

    Works for a :class:`peft.PeftModel` (LoRA layers live inside the decoder, and
    ``disable_adapter()`` still applies) and for a plain ``transformers`` causal LM.
    """
    lm = _unwrap(model)
    get_decoder = getattr(lm, "get_decoder", None)
    # Module.__getattr__ is typed Tensor | Module; a transformers model's is a method
    head = (cast(Callable[[], torch.nn.Module | None], lm.get_output_embeddings)()
            if hasattr(lm, "get_output_embeddings") else None)
    if not callable(get_decoder) or head is None or not hasattr(head, "weight"):
        raise ConfigError(f"{type(lm).__name__} exposes no decoder and lm_head; dpgrpo needs a "
                          "transformers causal LM")
    config = getattr(lm, "config", None)
    if getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        raise ConfigError(f"{type(lm).__name__} scales its logits (logit_scale); not supported")
    softcap = getattr(config, "final_logit_softcapping", None)
    return get_decoder(), head, (float(softcap) if softcap else None)


def shared_prompt_end(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      want: torch.Tensor, group_size: int) -> int:
    """The first scored column if each run of ``group_size`` consecutive rows has identical
    tokens and mask before it (one prompt's completions), else 0 (no prompt to share)."""
    n, _length = input_ids.shape
    if group_size < 2 or n == 0 or n % group_size or not bool(want.any()):
        return 0
    start = int(want.any(0).long().argmax())
    if start < 1:
        return 0
    ids = input_ids[:, :start].reshape(n // group_size, group_size, start)
    mask = attention_mask[:, :start].reshape(n // group_size, group_size, start)
    same = bool((ids == ids[:, :1]).all()) and bool((mask == mask[:, :1]).all())
    return start if same and bool(mask[:, 0].any(-1).all()) else 0


def uses_checkpointing(model: torch.nn.Module) -> bool:
    """Whether some layer recomputes itself in backward (transformers then drops the cache)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _shared_prompt_states(model: torch.nn.Module, decoder: Callable[..., Any],
                          input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int,
                          group_size: int) -> torch.Tensor:
    """(N, L - start, H) hidden states predicting tokens ``start .. L-1`` of each row, each
    group's prompt (columns ``< start``) run once and its key/value cache extended by the
    group's rows, as decoding does. Differentiable: with grad enabled the cache is a plain
    ``DynamicCache`` (concatenation), so backward reaches the prompt's pass through it."""
    from dpgrpo.rollout.decode import cache_keyword, new_cache, plain_cache

    g = group_size
    cache = plain_cache(model) if torch.is_grad_enabled() else new_cache(model, input_ids.shape[1])
    key = cache_keyword(model)
    p_ids, p_mask = input_ids[::g, :start], attention_mask[::g, :start]            # (B, P)
    h_last = decoder(input_ids=p_ids, attention_mask=p_mask,
                     position_ids=(p_mask.long().cumsum(1) - 1).clamp(min=0),
                     use_cache=True, **{key: cache}).last_hidden_state[:, -1]      # (B, H)
    cache.batch_repeat_interleave(g)
    positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)[:, start:]
    hidden = decoder(input_ids=input_ids[:, start:], attention_mask=attention_mask,
                     position_ids=positions, use_cache=True,
                     **{key: cache}).last_hidden_state                              # (N, C, H)
    # token start + j is predicted from the state before it: the prompt's last for j = 0
    return torch.cat([h_last.repeat_interleave(g, 0)[:, None], hidden[:, :-1]], 1)


def _scoring_states(model: torch.nn.Module, decoder: Callable[..., Any],
                    input_ids: torch.Tensor, attention_mask: torch.Tensor, want: torch.Tensor,
                    group_size: int | None) -> tuple[torch.Tensor, int]:
    """Hidden states ``S`` and a column ``s`` such that ``S[:, j]`` predicts token ``s + j``.

    With ``group_size`` and rows that share their prompt (:func:`shared_prompt_end`), each
    prompt is run once (its G rows would otherwise repeat it G times); otherwise (or under
    gradient checkpointing, which drops the cache) one plain forward over every row.
    """
    start = 0
    if group_size is not None and not uses_checkpointing(model):
        start = shared_prompt_end(input_ids, attention_mask, want, group_size)
    if start:
        return _shared_prompt_states(model, decoder, input_ids, attention_mask, start,
                                     cast(int, group_size)), start  # start > 0: G is set
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)      # (N, L)
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids, use_cache=False).last_hidden_state  # (N, L, H)
    return hidden[:, :-1], 1


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, *, first: int = 1,
                   mask: torch.Tensor | None = None,
                   chunk: int | None = None, group_size: int | None = None,
                   trunk: Trunk | None = None, temperature: float = 1.0) -> torch.Tensor:
    """log pi(token_k | prefix) at scored positions, zeros elsewhere; (N, L) -> (N, L).

    A position k is scored if k >= ``first`` and, when ``mask`` (N, L) is given, ``mask[:, k]``
    is set; position 0 has no prefix and is never scored. Position ids follow the attention mask,
    so a left-padded row sees the positions it was generated with. Output dtype: fp32, or fp64
    for fp64 models. Differentiable with respect to the adapter; no (N, L, V) tensor is formed.
    ``group_size`` G: rows ``i*G .. i*G+G-1`` may be completions of one prompt; if they are
    (identical up to the first scored column), that prompt runs once for its G rows, which
    gives the same values up to float rounding. ``trunk``: the frozen layers' states of this
    window are recorded into it (while it is recording) or replayed from it (:mod:`.trunk`).
    ``temperature`` T: log-probs of the tempered policy softmax(logits / T), the distribution a
    sampler at temperature T draws from (1: the model's own).
    """
    n, length = input_ids.shape
    decoder, head, softcap = decoder_and_head(model)
    weight = cast(torch.Tensor, head.weight)    # a Module attribute: typed Tensor | Module
    out_dtype = _compute_dtype(weight.dtype)
    out = torch.zeros((n, length), dtype=out_dtype, device=input_ids.device)
    want = torch.zeros((n, length), dtype=torch.bool, device=input_ids.device)
    want[:, max(int(first), 1):] = True
    if mask is not None:
        want &= mask.bool()
    if n == 0 or not bool(want.any()):
        return out
    with (trunk.window(decoder, input_ids, attention_mask, want, group_size)
          if trunk is not None else nullcontext(decoder)) as run:
        states, start = _scoring_states(model, run, input_ids, attention_mask, want,
                                        group_size)
    picked = states[want[:, start:]]                                          # (K, H)
    targets = input_ids[:, start:][want[:, start:]]                           # (K,)
    logp = chosen_logprobs(picked, weight, targets, bias=getattr(head, "bias", None),
                           softcap=softcap, chunk=chunk, temperature=temperature)  # (K,)
    return out.masked_scatter(want, logp.to(out_dtype))


def token_logprobs_and_entropy(model: torch.nn.Module, input_ids: torch.Tensor,
                               attention_mask: torch.Tensor, mask: torch.Tensor, *,
                               chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad (N, L) log-probs and predictive entropies at ``mask[:, 1:]`` positions (audit).

    Entry k scores token k given tokens < k (as :func:`token_logprobs`); the entropy is that of
    the model's distribution over token k. Computed chunk by chunk, never (N, L, V) at once.
    """
    n, length = input_ids.shape
    decoder, head, softcap = decoder_and_head(model)
    weight = cast(torch.Tensor, head.weight)    # a Module attribute: typed Tensor | Module
    dtype = _compute_dtype(weight.dtype)
    logp = torch.zeros((n, length), dtype=dtype, device=input_ids.device)
    ent = torch.zeros_like(logp)
    want = torch.zeros((n, length), dtype=torch.bool, device=input_ids.device)
    want[:, 1:] = mask[:, 1:].bool()
    if n == 0 or not bool(want.any()):
        return logp, ent
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=False).last_hidden_state
        picked = hidden[:, :-1][want[:, 1:]]                                  # (K, H)
        targets = input_ids[:, 1:][want[:, 1:]]
        size = chunk or max(1, DEFAULT_LOGIT_ELEMENTS // weight.shape[0])
        lp, h = [], []
        for s in range(0, picked.shape[0], size):
            z, _ = _chunk_logits(picked[s:s + size], weight, getattr(head, "bias", None),
                                 softcap)
            z = torch.log_softmax(z, dim=-1)                                  # (k, V)
            lp.append(z.gather(-1, targets[s:s + size].unsqueeze(-1)).squeeze(-1))
            h.append(-(z.exp() * z).sum(-1))
    return logp.masked_scatter(want, torch.cat(lp)), ent.masked_scatter(want, torch.cat(h))


__all__ = ["DEFAULT_LOGIT_ELEMENTS", "chosen_logprobs", "decoder_and_head", "shared_prompt_end",
           "token_logprobs", "token_logprobs_and_entropy", "uses_checkpointing"]
