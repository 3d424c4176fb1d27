"""One-run empirical epsilon lower bound (Steinke, Nasr and Jagielski, NeurIPS 2023).

Setting. m canaries are each included in training independently with probability 1/2 (the
secret bits S in {-1, +1}^m). After the single training run the auditor scores every canary
from the released model alone, guesses "in" (+1) for the ``k_plus`` highest scores and "out"
(-1) for the ``k_minus`` lowest, and abstains on the rest; r = k_plus + k_minus guesses are
made, of which v are correct.

What is implemented, exactly.

* ``delta == 0`` (their Theorem 3.1): if the training procedure is epsilon-DP with respect to
  the add/remove of any one canary, the number of correct guesses W is stochastically dominated
  by Binomial(r, q) with ``q = e^eps / (1 + e^eps)``, so the p-value of observing v is
  ``f_eps(v) = P[Binomial(r, q) >= v]``.
* ``delta > 0`` (their Theorem 3.3 and the p-value routine of their Appendix D): under
  (eps, delta)-DP, ``P[W >= v] <= f_eps(v) + 2 m delta max_{1<=i<=v} (f_eps(v-i) - f_eps(v)) / i``,
  where ``f_eps(v-i) - f_eps(v) = P[v-i <= Binomial(r, q) < v]``; the p-value is that bound,
  capped at 1. Here m is the number of randomized canaries, abstentions included.
* The lower bound at confidence ``1 - beta`` is the largest eps (found by bisection to
  ``tol``; the returned value is always the side whose p-value is below beta) such that the
  p-value is below beta: the hypothesis "the run is (eps, delta)-DP" is rejected at level beta.
  Rejecting (eps, delta)-DP also rejects every smaller eps at the same delta, because
  (eps', delta)-DP with eps' < eps implies (eps, delta)-DP. It is 0 when nothing is rejected.

The guesses must be a function of the release and public information only (never of the
inclusion bits), and k_plus, k_minus must be fixed before looking at the bits; choosing them
after looking needs a multiple-testing correction (``sweep_lower_bound`` applies Bonferroni).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypeAlias

import numpy as np
from scipy import special, stats

#: One value per canary, as a sequence or an array (each is read with ``np.asarray``).
_Floats: TypeAlias = "Sequence[float] | np.ndarray"
_Ints: TypeAlias = "Sequence[int] | np.ndarray"
_Bools: TypeAlias = "Sequence[bool] | np.ndarray"


def make_guesses(scores: _Floats, *, k_plus: int, k_minus: int) -> np.ndarray:
    """Guesses in {-1, 0, +1}: +1 for the ``k_plus`` highest scores, -1 for the ``k_minus`` lowest.

    Ties are broken by canary index (a stable sort), which does not depend on the secret bits.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    m = s.size
    if np.isnan(s).any():
        raise ValueError("canary scores contain NaN; score every canary before guessing")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need 0 <= k_plus, k_minus and k_plus + k_minus <= m = {m}, "
                         f"got {k_plus}, {k_minus}")
    order = np.argsort(-s, kind="stable")               # highest first
    guesses = np.zeros(m, dtype=np.int8)
    guesses[order[:k_plus]] = 1
    if k_minus:
        guesses[order[m - k_minus:]] = -1
    return guesses


def count_correct(guesses: _Ints, included: _Bools) -> tuple[int, int]:
    """``(r, v)``: the number of non-abstaining guesses and how many of them are correct."""
    g = np.asarray(guesses).astype(int).ravel()
    b = np.where(np.asarray(included).astype(bool).ravel(), 1, -1)
    if g.shape != b.shape:
        raise ValueError(f"{g.size} guesses for {b.size} canaries")
    return int((g != 0).sum()), int((g * b == 1).sum())


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P-value of at least v correct out of r guesses under (epsilon, delta)-DP, m canaries.

    ``delta = 0``: ``P[Binomial(r, q) >= v]``, ``q = e^eps/(1+e^eps)`` (Theorem 3.1).
    ``delta > 0``: plus ``2 m delta max_i P[v-i <= Binomial(r, q) < v] / i`` (Theorem 3.3).
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = float(special.expit(epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))           # P[B >= v]
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    pmf = stats.binom.pmf(np.arange(v), r, q)           # P[B = j], j = 0 .. v-1
    window = np.cumsum(pmf[::-1])                       # i-th entry: P[v-i <= B < v], i = 1..v
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def lower_bound_from_counts(m: int, r: int, v: int, *, delta: float, confidence: float,
                            tol: float = 1e-6, eps_max: float = 100.0) -> float:
    """Largest epsilon rejected at level ``1 - confidence`` given m canaries, r guesses, v correct.

    Bisection keeps ``p_value(lo) < beta <= p_value(hi)`` and returns ``lo``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2.0 * hi
        if hi > eps_max:
            return lo                                   # rejected up to the search cap
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def epsilon_lower_bound(scores: _Floats, included: _Bools, *, k_plus: int,
                        k_minus: int, delta: float, confidence: float = 0.95) -> float:
    """The one-run empirical epsilon lower bound of Steinke, Nasr and Jagielski (2023).

    ``scores``: one membership score per canary, computed from the release alone (higher: more
    likely included); ``included``: the secret inclusion bits. Guesses the top ``k_plus`` "in"
    and the bottom ``k_minus`` "out", counts correct guesses and returns the largest epsilon at
    which (epsilon, delta)-DP is rejected with the given confidence (module docstring).
    """
    guesses = make_guesses(scores, k_plus=k_plus, k_minus=k_minus)
    r, v = count_correct(guesses, included)
    return lower_bound_from_counts(len(guesses), r, v, delta=delta, confidence=confidence)


@dataclass(frozen=True)
class OneRunResult:
    """One audit: canaries m, guesses r (= k_plus + k_minus), correct v, and the bound."""

    m: int
    k_plus: int
    k_minus: int
    r: int
    v: int
    delta: float
    confidence: float
    epsilon_lower_bound: float
    tests: int = 1                                      # Bonferroni factor applied (1: none)

    def to_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return asdict(self)


def one_run_audit(scores: _Floats, included: _Bools, *, k_plus: int,
                  k_minus: int, delta: float, confidence: float = 0.95,
                  tests: int = 1) -> OneRunResult:
    """:func:`epsilon_lower_bound` with its counts; ``tests > 1`` tests at level beta / tests."""
    guesses = make_guesses(scores, k_plus=k_plus, k_minus=k_minus)
    r, v = count_correct(guesses, included)
    level = 1.0 - (1.0 - confidence) / tests
    eps = lower_bound_from_counts(len(guesses), r, v, delta=delta, confidence=level)
    return OneRunResult(len(guesses), k_plus, k_minus, r, v, delta, confidence, eps, tests)


def sweep_lower_bound(scores: _Floats, included: _Bools, *,
                      ks: Sequence[tuple[int, int]], delta: float,
                      confidence: float = 0.95) -> OneRunResult:
    """The best bound over several ``(k_plus, k_minus)`` choices, Bonferroni-corrected.

    Each choice is tested at level ``(1 - confidence) / len(ks)``, so the maximum over the grid
    is still a valid lower bound at ``confidence`` (union bound over the tests).
    """
    if not ks:
        raise ValueError("need at least one (k_plus, k_minus) choice")
    results = [one_run_audit(scores, included, k_plus=kp, k_minus=km, delta=delta,
                             confidence=confidence, tests=len(ks)) for kp, km in ks]
    return max(results, key=lambda res: res.epsilon_lower_bound)
