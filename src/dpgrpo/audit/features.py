"""DIBA features from arrays: rewards, per-token log-probabilities and response texts.

Pure numpy. For one candidate prompt q the attack (Liu et al., "GRPO Privacy Is at Risk",
Section 5, Figure 2) samples N responses from the fine-tuned policy pi_ft and N from the base
pi_ref, and computes six prompt-level features:

* ``ft_score``: mean verifier reward of the fine-tuned samples ("FT Score");
* ``base_score``: mean verifier reward of the base samples ("Base Score");
* ``score_gain``: their difference, the advantage signal s^Adv_q;
* ``k3_divergence``: the k3 estimator of KL(pi_ft || pi_ref) on the fine-tuned samples,
  token-mean of ``r - log r - 1`` with ``r = pi_ref / pi_ft``, averaged over the N samples;
* ``likelihood_ratio``: mean over samples of ``log pi_ft(o|q) - log pi_ref(o|q)`` (s^LiRA_q);
* ``zlib_likelihood_ratio``: the same ratio divided by the zlib-compressed byte length of each
  response before averaging (s^Zlib_q).

Per-token arrays are ``(N, T)``, right- or left-padded, with a boolean ``mask`` that is True
exactly on response tokens. A response with no tokens contributes NaN to the token-mean
features; prompt-level means ignore NaN and are NaN only when every response is empty (the
classifier imputes them).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: DIBA's feature columns, in the order of the feature matrix.
DIBA_FEATURES: tuple[str, ...] = (
    "ft_score",
    "base_score",
    "score_gain",
    "k3_divergence",
    "likelihood_ratio",
    "zlib_likelihood_ratio",
)


def _as_float(a) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def _as_mask(mask, shape: tuple[int, ...]) -> np.ndarray:
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    m = np.asarray(mask).astype(bool)
    if m.shape != shape:
        raise ValueError(f"mask shape {m.shape} does not match log-probabilities {shape}")
    return m


def _nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0 or np.all(np.isnan(x)):
        return float("nan")
    return float(np.nanmean(x))


def zlib_length(text: str) -> int:
    """Bytes of ``zlib.compress`` of the UTF-8 text (Carlini et al., 2021); at least 8."""
    return len(zlib.compress(text.encode("utf-8")))


def k3_divergence(logp_ft, logp_base, mask) -> np.ndarray:
    """Per-response token-mean k3 estimate of KL(pi_ft || pi_ref) on samples from pi_ft.

    With ``d_t = log pi_ref(o_t) - log pi_ft(o_t)``, k3 is ``exp(d_t) - d_t - 1 >= 0``
    (Schulman, "Approximating KL divergence"; DIBA Section 5). Returns shape ``(N,)``; NaN for a
    response without tokens.
    """
    lf, lb = _as_float(logp_ft), _as_float(logp_base)
    if lf.shape != lb.shape:
        raise ValueError(f"log-probability shapes differ: {lf.shape} vs {lb.shape}")
    m = _as_mask(mask, lf.shape)
    d = np.where(m, lb - lf, 0.0)                       # (N, T)
    k3 = np.expm1(d) - d                                # exp(d) - d - 1, exact near d = 0
    n_tok = m.sum(axis=-1)                              # (N,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_tok > 0, (k3 * m).sum(axis=-1) / n_tok, np.nan)


def sequence_log_ratio(logp_ft, logp_base, mask) -> np.ndarray:
    """Per-response ``log pi_ft(o|q) - log pi_ref(o|q)``, the sum over response tokens. ``(N,)``."""
    lf, lb = _as_float(logp_ft), _as_float(logp_base)
    if lf.shape != lb.shape:
        raise ValueError(f"log-probability shapes differ: {lf.shape} vs {lb.shape}")
    m = _as_mask(mask, lf.shape)
    return np.where(m, lf - lb, 0.0).sum(axis=-1)


@dataclass(frozen=True)
class SampleScores:
    """N responses sampled from the fine-tuned policy for one prompt, scored by both models.

    ``logp_ft`` and ``logp_base`` are ``(N, T)`` per-token log-probabilities of the sampled
    tokens under pi_ft and pi_ref; ``mask`` is ``(N, T)`` True on response tokens; ``texts``
    are the N decoded responses (for zlib).
    """

    logp_ft: np.ndarray
    logp_base: np.ndarray
    mask: np.ndarray
    texts: tuple[str, ...]

    def __post_init__(self) -> None:
        lf, lb = _as_float(self.logp_ft), _as_float(self.logp_base)
        if lf.ndim != 2 or lf.shape != lb.shape:
            raise ValueError(f"expected two (N, T) arrays, got {lf.shape} and {lb.shape}")
        object.__setattr__(self, "logp_ft", lf)
        object.__setattr__(self, "logp_base", lb)
        object.__setattr__(self, "mask", _as_mask(self.mask, lf.shape))
        object.__setattr__(self, "texts", tuple(self.texts))
        if len(self.texts) != lf.shape[0]:
            raise ValueError(f"{len(self.texts)} texts for {lf.shape[0]} responses")


def diba_features(ft_rewards: Sequence[float], base_rewards: Sequence[float],
                  ft_samples: SampleScores) -> dict[str, float]:
    """The six DIBA features of one prompt (module docstring; DIBA Section 5, Figure 2).

    ``ft_rewards`` and ``base_rewards`` are the verifier rewards (0/1) of the N fine-tuned and
    N base samples; ``ft_samples`` holds the fine-tuned samples scored under both models.
    """
    ft = _as_float(ft_rewards).ravel()
    base = _as_float(base_rewards).ravel()
    if ft.size == 0 or base.size == 0:
        raise ValueError("need at least one reward from each model")
    ft_score, base_score = float(ft.mean()), float(base.mean())
    k3 = k3_divergence(ft_samples.logp_ft, ft_samples.logp_base, ft_samples.mask)
    ratio = sequence_log_ratio(ft_samples.logp_ft, ft_samples.logp_base, ft_samples.mask)
    zlen = np.array([zlib_length(t) for t in ft_samples.texts], dtype=np.float64)
    return {
        "ft_score": ft_score,
        "base_score": base_score,
        "score_gain": ft_score - base_score,
        "k3_divergence": _nanmean(k3),
        "likelihood_ratio": _nanmean(ratio),
        "zlib_likelihood_ratio": _nanmean(ratio / zlen),
    }


def feature_matrix(rows: Sequence[Mapping[str, float]],
                   names: Sequence[str] = DIBA_FEATURES) -> np.ndarray:
    """Stack per-prompt feature dictionaries into an ``(n_prompts, len(names))`` float array."""
    missing = [n for n in names if rows and n not in rows[0]]
    if missing:
        raise KeyError(f"feature rows lack {missing}")
    return np.array([[float(r[n]) for n in names] for r in rows], dtype=np.float64).reshape(
        len(rows), len(names))
