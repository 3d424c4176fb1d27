"""Memorization-based membership baselines (LOSS, zlib, Min-K%, entropy), raw and calibrated.

Pure numpy. These are the baselines of the attack paper's Table 1 (DIBA, Section 4.2 and
Appendices A and C), adapted, as there, to RLVR by scoring the reference answer as a response:
each candidate prompt q is paired with its gold target text o (``Task.gold_target``), and a
score is computed from the per-token log-probabilities ``log pi(o_t | q, o_<t)`` and predictive
entropies of o under one model. The paper grants the adversary the reference answer on purpose
(Section 4.2): it turns the task into one resembling SFT, where these attacks should work best.

Every score is oriented so that higher means "more likely a member":

* ``loss``: ``log pi(o|q)`` = minus the LOSS attack's NLL (Yeom et al., 2018);
* ``zlib``: ``log pi(o|q) / zlib(o)``, minus NLL over compressed byte length (Carlini et al., 2021);
* ``min_k``: mean log-probability of the k% = 20% least likely tokens (Shi et al., 2024);
* ``entropy``: minus the token-mean predictive entropy (lower entropy: more confident).

The calibrated variant of each (``<name>_calibrated``) is the score under the fine-tuned model
minus the same score under the base model on the same text (Appendix C; LoRA-Leak, Ran et al.),
which removes what the base model already knew about the text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpgrpo.audit.features import zlib_length

#: Baseline names, raw; each also has a ``<name>_calibrated`` variant.
BASELINES: tuple[str, ...] = ("loss", "zlib", "min_k", "entropy")


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics of B texts under one model, ``(B, T)`` each, padded.

    ``logp``: log-probability of each actual token; ``entropy``: entropy (nats) of the model's
    predictive distribution at that position; ``mask``: True on the scored (response) tokens.
    """

    logp: np.ndarray
    entropy: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        lp = np.asarray(self.logp, dtype=np.float64)
        ent = np.asarray(self.entropy, dtype=np.float64)
        m = np.asarray(self.mask).astype(bool)
        if lp.ndim != 2 or lp.shape != ent.shape or lp.shape != m.shape:
            raise ValueError(f"shapes differ: logp {lp.shape}, entropy {ent.shape}, mask {m.shape}")
        object.__setattr__(self, "logp", lp)
        object.__setattr__(self, "entropy", ent)
        object.__setattr__(self, "mask", m)


def _token_mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    n = mask.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(mask, x, 0.0).sum(axis=-1) / n, np.nan)


def loss_score(logp: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``log pi(o|q)``, the sum of token log-probabilities (minus LOSS's NLL). ``(B,)``."""
    return np.where(np.asarray(mask, bool), np.asarray(logp, np.float64), 0.0).sum(axis=-1)


def zlib_score(logp: np.ndarray, mask: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """``log pi(o|q) / zlib(o)`` with zlib the compressed byte length of o. ``(B,)``."""
    z = np.array([zlib_length(t) for t in texts], dtype=np.float64)
    return loss_score(logp, mask) / z


def min_k_score(logp: np.ndarray, mask: np.ndarray, k: float = 0.2) -> np.ndarray:
    """Mean log-probability of the ``ceil(k * |o|)`` least likely tokens of each text. ``(B,)``.

    Higher (the least likely tokens are still likely) indicates a member (Min-K% Prob, Shi et
    al., 2024; DIBA Appendix C uses k = 0.2). NaN for a text without tokens.
    """
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be in (0, 1], got {k}")
    lp = np.asarray(logp, np.float64)
    m = np.asarray(mask, bool)
    out = np.full(lp.shape[0], np.nan)
    for i in range(lp.shape[0]):
        tokens = np.sort(lp[i][m[i]])                   # ascending: least likely first
        if tokens.size:
            out[i] = tokens[: max(1, math.ceil(k * tokens.size))].mean()
    return out


def entropy_score(entropy: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Minus the token-mean predictive entropy over the scored tokens. ``(B,)``."""
    return -_token_mean(np.asarray(entropy, np.float64), np.asarray(mask, bool))


def raw_scores(stats: TokenStats, texts: Sequence[str], *, k: float = 0.2) -> dict[str, np.ndarray]:
    """The four baseline scores of B texts under one model."""
    if len(texts) != stats.logp.shape[0]:
        raise ValueError(f"{len(texts)} texts for {stats.logp.shape[0]} rows")
    return {
        "loss": loss_score(stats.logp, stats.mask),
        "zlib": zlib_score(stats.logp, stats.mask, texts),
        "min_k": min_k_score(stats.logp, stats.mask, k),
        "entropy": entropy_score(stats.entropy, stats.mask),
    }


def baseline_scores(ft: TokenStats, base: TokenStats, texts: Sequence[str], *,
                    k: float = 0.2) -> dict[str, np.ndarray]:
    """Raw scores under the fine-tuned model and their base-calibrated variants.

    Returns ``{"loss", "loss_calibrated", "zlib", "zlib_calibrated", ...}``, each ``(B,)``; the
    calibrated score is ``score_ft - score_base`` on the same texts (DIBA Appendix C).
    """
    if not np.array_equal(ft.mask, base.mask):
        raise ValueError("fine-tuned and base statistics must score the same tokens")
    raw_ft = raw_scores(ft, texts, k=k)
    raw_base = raw_scores(base, texts, k=k)
    out: dict[str, np.ndarray] = {}
    for name in BASELINES:
        out[name] = raw_ft[name]
        out[f"{name}_calibrated"] = raw_ft[name] - raw_base[name]
    return out
