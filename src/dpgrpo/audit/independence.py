"""Are the rounds' noises independent? A check of the white-box audit (issue 58).

The accountant composes T independent Gaussian mechanisms; a round key drawn once (or any
reuse of noise across rounds) voids that: subtracting one round's update from the next cancels
the reused noise and reveals the records exactly, while audit mode's mu and the one-run bounds
barely move. The excluded canaries see only noise: ``rounds[t, i]`` for an excluded i is, for a
correct mechanism, N(0, 1) independent over t and i (orthonormal directions, isotropic noise,
a fresh key each round), whatever q is. So across the n excluded canaries the correlation of
rounds s and t has Fisher z = atanh(r) sqrt(n - 3), about N(0, 1) under independence.

Three statistics, each turned into a p-value and flagged below ``alpha / 3`` (Bonferroni over
the three, so the whole check's false-alarm rate is at most ``alpha``, 1e-3 by default):

* ``consecutive``: max |z| over the T - 1 pairs of consecutive rounds (Sidak over the pairs):
  a key reused from one round to the next;
* ``any_pair``: max |z| over all T (T - 1) / 2 pairs: reuse across a gap (a key per epoch);
* ``pooled``: the mean z of consecutive pairs times sqrt(T - 1): a weak correlation in every
  round (noise that is partly shared).

The report names the statistics that flagged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

#: Whole-check false-alarm rate for a correct mechanism.
INDEPENDENCE_ALPHA = 1e-3
STATISTICS = ("consecutive", "any_pair", "pooled")


@dataclass(frozen=True)
class Independence:
    """The three statistics' values and p-values, and the names of those that flagged."""

    rounds: int
    canaries: int               # excluded canaries used
    consecutive_max_z: float
    any_pair_max_z: float
    pooled_z: float
    p_values: dict
    alpha: float
    flagged_by: tuple[str, ...]

    @property
    def flagged(self) -> bool:
        return bool(self.flagged_by)

    def to_dict(self) -> dict:
        return asdict(self) | {"flagged": self.flagged, "flagged_by": list(self.flagged_by)}


def _sidak(p_single: float, tests: int) -> float:
    return float(-math.expm1(tests * math.log1p(-min(p_single, 1.0 - 1e-16))))


def fisher_z(noise: np.ndarray) -> np.ndarray:
    """(T, T) Fisher z of the correlation between rounds (rows) across columns."""
    n = noise.shape[1]
    r = np.clip(np.corrcoef(noise), -1.0 + 1e-15, 1.0 - 1e-15)
    return np.arctanh(r) * math.sqrt(n - 3)


def round_independence(rounds: np.ndarray, included: np.ndarray, *,
                       alpha: float = INDEPENDENCE_ALPHA) -> Independence:
    """The check on an audit's (T, K) projections; uses the excluded canaries only."""
    noise = np.asarray(rounds, dtype=np.float64)[:, ~np.asarray(included, dtype=bool)]
    t, n = noise.shape
    if t < 2 or n < 8:
        return Independence(t, n, math.nan, math.nan, math.nan, {}, alpha, ())
    z = fisher_z(noise)
    cons = np.diagonal(z, offset=1)
    upper = z[np.triu_indices(t, k=1)]
    c_max, a_max = float(np.abs(cons).max()), float(np.abs(upper).max())
    pooled = float(cons.mean() * math.sqrt(t - 1))
    p = {"consecutive": _sidak(2 * stats.norm.sf(c_max), t - 1),
         "any_pair": _sidak(2 * stats.norm.sf(a_max), upper.size),
         "pooled": float(2 * stats.norm.sf(abs(pooled)))}
    flagged = tuple(k for k in STATISTICS if not p[k] > alpha / len(STATISTICS))
    return Independence(t, n, c_max, a_max, pooled, p, alpha, flagged)


def describe(ind: dict) -> str:
    """One phrase for the report: which statistic flagged, with its value."""
    if not ind.get("flagged_by"):
        return (f"noise independent across rounds (max |z| {ind['consecutive_max_z']:.2f} "
                f"consecutive, {ind['any_pair_max_z']:.2f} any pair)")
    values = {"consecutive": ind["consecutive_max_z"], "any_pair": ind["any_pair_max_z"],
              "pooled": ind["pooled_z"]}
    parts = [f"{k} z = {values[k]:.3g} (p {ind['p_values'][k]:.2g})" for k in ind["flagged_by"]]
    return "rounds' noises correlated: " + ", ".join(parts)


__all__ = [
    "INDEPENDENCE_ALPHA",
    "STATISTICS",
    "Independence",
    "describe",
    "fisher_z",
    "round_independence",
]
