"""Next-token sampling with per-row coins fixed in advance (Algorithm 1, line 4).

Each prompt's G completions draw their randomness from a table of uniforms, ``coins[row, t]``,
filled from that prompt's own seed before generation starts (:func:`row_coins`). A token is
the inverse CDF of the processed distribution at the row's coin for that step, which is an
exact draw from the categorical distribution (as ``torch.multinomial`` is). A prompt's coins
therefore never depend on which prompts share its forward passes, on how rows are split into
calls, or on when other rows stop: in exact arithmetic its completions depend only on the
prompt, the weights and its seed (assumption A2). Floating-point kernels are not guaranteed
batch-invariant, so a batch-mate can still move a logit in its last bits and flip a token whose
coin lies at a CDF boundary; isolated mode removes that too (one prompt per forward pass).

The processing order is the one of ``transformers`` ``generate``: repetition penalty on the raw
logits, then temperature, then top-p (nucleus) filtering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpgrpo.errors import ConfigError


@dataclass(frozen=True)
class SamplerSettings:
    """How a token is drawn: temperature 0 is greedy (argmax, no coins)."""

    temperature: float
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0 and self.repetition_penalty > 0.0):
            raise ConfigError(f"need 0 < top_p <= 1 and repetition_penalty > 0, got "
                              f"{self.top_p} and {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def row_coins(seeds: Sequence[int], group_size: int, max_new_tokens: int) -> torch.Tensor:
    """``(len(seeds) * group_size, max_new_tokens)`` fp64 uniforms in [0, 1), prompt-major:
    rows ``i*G .. i*G+G-1`` are the ChaCha20 keystream keyed by ``seeds[i]`` alone (53-bit
    uniforms from 64-bit words; :func:`dpgrpo.privacy.record_coins.uniforms`).

    A seed is an integer in [0, 2^256), all of it the key: the trainer passes each prompt a
    256-bit seed bound to its (round, slot) (:mod:`dpgrpo.privacy.record_coins`), so its coins
    have 256 secret bits and no batch-mate or position can change them. (A ``torch.Generator``
    seeded with it would keep 32 of those bits on the CPU.)
    """
    from dpgrpo.privacy.record_coins import seed_key, uniforms

    count = group_size * max_new_tokens
    tables = [torch.from_numpy(uniforms(seed_key(int(s)), bytes(16), count).copy())
              .reshape(group_size, max_new_tokens) for s in seeds]
    return torch.cat(tables) if tables else torch.zeros((0, max_new_tokens), dtype=torch.float64)


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (as transformers applies it): the logit of every token already
    in the row (``seen``, (A, V) bool) is divided by ``penalty`` if positive, else multiplied."""
    scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, scaled, logits)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p`` (Holtzman
    et al., 2020), as transformers' ``TopPLogitsWarper`` does; the rest get -inf."""
    sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - top_p)
    drop_sorted[..., -1:] = False                                   # keep at least one token
    drop = drop_sorted.scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _last_positive(probs: torch.Tensor) -> torch.Tensor:
    """Index of the last entry > 0 of each row (the fallback when rounding overshoots)."""
    width = probs.shape[-1]
    return width - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)


def inverse_cdf(probs: torch.Tensor, coins: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Token ``k`` with ``cdf[k-1] <= u * cdf[-1] < cdf[k]`` for each row: an exact categorical
    draw given ``u ~ U[0, 1)`` (``probs`` (A, V), ``coins`` (A,)).

    Two levels, summed in fp64: the block of ``block`` tokens holding the target, then the token
    inside it (8x cheaper than an fp64 cumsum over the vocabulary). A zero-probability token is
    never returned (it has no width); where rounding would overshoot a row's last positive
    entry, that entry is returned.
    """
    rows, vocab = probs.shape
    extra = (-vocab) % block
    padded = torch.nn.functional.pad(probs, (0, extra)) if extra else probs      # zeros: no width
    blocks = padded.view(rows, -1, block)                                         # (A, nb, k)
    sums = blocks.sum(dim=-1, dtype=torch.float64)                                # (A, nb)
    block_cdf = sums.cumsum(dim=-1)
    target = coins.to(block_cdf) * block_cdf[:, -1]                               # (A,)
    b = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1)
    b = torch.where(b >= sums.shape[1], _last_positive(sums), b)
    below = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0).unsqueeze(1)).squeeze(1),
                        torch.zeros_like(target))
    inside = blocks[torch.arange(rows, device=probs.device), b]                   # (A, k)
    inner_cdf = inside.double().cumsum(dim=-1)
    k = torch.searchsorted(inner_cdf, (target - below).unsqueeze(1), right=True).squeeze(1)
    k = torch.where(k >= block, _last_positive(inside), k)
    return b * block + k


def next_tokens(logits: torch.Tensor, coins: torch.Tensor | None, settings: SamplerSettings,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """``(A,)`` next tokens from ``(A, V)`` logits; ``coins`` ``(A,)`` (unused when greedy)."""
    logits = logits.float()
    if settings.repetition_penalty != 1.0 and seen is not None:
        logits = penalize_repetition(logits, seen, settings.repetition_penalty)
    if settings.greedy:
        return logits.argmax(dim=-1)
    if coins is None:
        raise ConfigError("sampling at temperature > 0 needs coins")
    logits = logits / settings.temperature
    if settings.top_p < 1.0:
        logits = top_p_filter(logits, settings.top_p)
    return inverse_cdf(logits.softmax(dim=-1), coins)


__all__ = ["SamplerSettings", "inverse_cdf", "next_tokens", "penalize_repetition", "row_coins",
           "top_p_filter"]
