"""Statistics of the white-box mechanism audit: scores, the one-run lower bound, the one-shot
Gaussian estimate, the calibration test that fails a broken mechanism, and the analytic values.

Units. ``rounds[t, i] = <u_i, update_t> q n / (sigma C)``: for a correct mechanism this is
``N(c_ti / sigma, 1)``, where c_ti = 1 when canary i was included and its slot was sampled in
round t (its clipped gradient C u_i then enters the sum), else 0; rounds are independent.

* Score for guessing (white-box): the log-likelihood ratio of "included" against "excluded"
  with the Poisson coins unknown (the auditor does not see them), which is the Neyman-Pearson
  optimal score for one canary: ``sum_t log(1 - q + q exp(Y_t / sigma - 1 / (2 sigma^2)))``.
* One-run lower bound (Steinke, Nasr and Jagielski 2023; :mod:`dpgrpo.audit.one_run`, reused):
  guess "in" for the k_plus highest scores (and "out" for the k_minus lowest), fixed before the
  bits are looked at, either by ``design`` (simulating the certified mechanism from public
  parameters alone, which also gives the bound a correct mechanism is expected to reach) or by
  ``half`` (chosen on one half of the canaries, the bound computed on the other half).
* One-shot estimate (Andrew et al. 2024): fit a Gaussian to the statistic of the excluded and of
  the included canaries; ``mu = (mean_in - mean_out) / sd_out`` and the epsilon of mu-GDP at the
  run's delta. The statistic is ``sum_t rounds[t] / sqrt(T)``, whose mu is sqrt(T)/sigma at
  q = 1 (the certified value, exactly Gaussian) and q sqrt(T)/sigma at q < 1 (a mixture there,
  so the fit then understates what the rounds reveal).
* Calibration (audit mode, q = 1): a broken mechanism moves mu (sigma/2, no clipping, noise on
  some coordinates) or the noise scale in known units (a data-dependent denominator); either
  beyond ``tolerance`` flags it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from dpgrpo.audit.one_run import count_correct, lower_bound_from_counts, make_guesses
from dpgrpo.privacy.accounting import RoundEvent, epsilon

CALIBRATION_TOLERANCE = 0.05     # relative; about 5 standard errors at K = 1,000 canaries
DESIGN_TRIALS = 20


def sum_statistic(rounds: np.ndarray) -> np.ndarray:
    """``sum_t rounds[t] / sqrt(T)`` per canary: N(mu, 1) with mu = sqrt(T)/sigma at q = 1."""
    return rounds.sum(axis=0) / math.sqrt(rounds.shape[0])


def llr_scores(rounds: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """The Neyman-Pearson score of each canary with the Poisson coins unknown (module doc)."""
    mu = 1.0 / sigma
    shifted = mu * rounds - 0.5 * mu * mu
    if q >= 1.0:
        return shifted.sum(axis=0)
    return np.logaddexp(math.log1p(-q), math.log(q) + shifted).sum(axis=0)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon at ``delta`` of mu-GDP (the Gaussian mechanism with sensitivity/std = mu): the
    root of dp_accounting's closed-form privacy profile (``GaussianPrivacyLoss``), found by
    scipy's brentq (a PLD discretization is slow at mu ~ 10); 0 for mu <= 0."""
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
    from scipy.optimize import brentq

    if not mu > 0:
        return 0.0
    profile = GaussianPrivacyLoss(1.0 / mu).get_delta_for_epsilon
    if profile(0.0) <= delta:
        return 0.0
    hi = 1.0
    while profile(hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: profile(e) - delta, 0.0, hi, xtol=1e-9))


class _Record:
    """A result as a JSON-able dict (``to_dict``), for the audit's report."""

    def to_dict(self) -> dict:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class GaussianFit(_Record):
    """Andrew et al.'s one-shot estimate from one statistic: mu and its epsilon at delta."""

    mu: float
    epsilon: float
    mean_in: float
    mean_out: float
    sd_in: float
    sd_out: float



def gaussian_fit(statistic: np.ndarray, included: np.ndarray, delta: float) -> GaussianFit:
    """Fit N(mean, sd) to the included and to the excluded canaries' statistic."""
    inc = np.asarray(included, dtype=bool)
    x_in, x_out = statistic[inc], statistic[~inc]
    if x_in.size < 2 or x_out.size < 2:
        return GaussianFit(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    sd_out = float(x_out.std(ddof=1))
    mu = float((x_in.mean() - x_out.mean()) / sd_out)
    return GaussianFit(mu, gdp_epsilon(mu, delta), float(x_in.mean()), float(x_out.mean()),
                       float(x_in.std(ddof=1)), sd_out)


def _grid(m: int) -> list[tuple[int, int]]:
    ks = sorted({max(1, int(round(x))) for x in np.geomspace(3, max(m // 2, 3), 14)})  # noqa: RUF046 - round() of a numpy float is a float before NumPy 2
    return [(k, 0) for k in ks] + [(k, k) for k in ks if 2 * k <= m]


def _bound(scores: np.ndarray, included: np.ndarray, ks: tuple[int, int], delta: float,
           confidence: float, tol: float = 1e-4) -> tuple[float, int, int]:
    guesses = make_guesses(scores, k_plus=ks[0], k_minus=ks[1])
    r, v = count_correct(guesses, included)
    return lower_bound_from_counts(scores.size, r, v, delta=delta, confidence=confidence,
                                   tol=tol), r, v


def _simulated_audits(m: int, q: float, sigma: float, rounds: int, trials: int, seed: int):
    """``trials`` white-box audits of the certified mechanism simulated from public
    parameters: (inclusion bits, Poisson coins of included canaries, likelihood-ratio scores)."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        bits = rng.random(m) < 0.5
        coins = (rng.random((rounds, m)) < q) & bits
        yield bits, coins, llr_scores(rng.standard_normal((rounds, m)) + coins / sigma, q, sigma)


@lru_cache(maxsize=16)
def design(m: int, q: float, sigma: float, rounds: int, delta: float, confidence: float = 0.95,
           trials: int = DESIGN_TRIALS, seed: int = 0) -> tuple[tuple[int, int], float]:
    """(k_plus, k_minus) fixed in advance, and the median bound it reaches, by simulating the
    certified mechanism's white-box scores (public parameters and a public seed only)."""
    table: dict[tuple[int, int], list[float]] = {ks: [] for ks in _grid(m)}
    for bits, _, scores in _simulated_audits(m, q, sigma, rounds, trials, seed):
        for ks in table:
            table[ks].append(_bound(scores, bits, ks, delta, confidence, tol=1e-3)[0])
    best = max(table, key=lambda ks: (float(np.median(table[ks])), -ks[0] - ks[1]))
    return best, float(np.median(table[best]))


def count_ceiling(r: int, v: int, *, confidence: float = 0.95) -> float:
    """The largest epsilon that ANY sound one-run bound computed from the counts (r guesses,
    v correct) can prove at ``confidence``, whatever its delta: Steinke et al.'s p-value at
    delta = 0, ``P[Binomial(r, e^eps/(1+e^eps)) >= v]`` (their Theorem 3.1).

    Why it is a ceiling. epsilon-randomized response with abstention (each canary on its own:
    a score independent of its bit, and the bit flipped with probability 1/(1+e^eps)) is
    epsilon-DP, hence (epsilon, delta)-DP for every delta and f_{epsilon,delta}-DP; with any r
    guesses its number of correct ones is exactly that Binomial. A sound test of
    "(epsilon, delta)-DP" must hold for it, so its p-value for v is at least that tail: the
    (epsilon, delta) bound of Steinke et al. (which adds 2 m delta terms) and the f-DP audit
    of Mahloujifar, Melis and Chaudhuri (2024) run with the (epsilon, delta) trade-off curve
    both stay at or below this number. (Their f-DP audit run with a Gaussian or subsampled-
    Gaussian curve rejects a curve, not (epsilon, delta)-DP at the run's delta.)
    """
    if not 0 <= v <= r:
        raise ValueError(f"need 0 <= v <= r, got v={v}, r={r}")
    if r == 0:
        return 0.0
    return lower_bound_from_counts(r, r, v, delta=0.0, confidence=confidence, tol=1e-4)


@dataclass(frozen=True)
class Ceiling(_Record):
    """What count-based one-run bounds can reach against the certified mechanism: the best
    fixed k's median :func:`count_ceiling` over simulated audits, and an oracle's median (one
    guessing exactly the included canaries sampled at least once, all correct)."""

    k_plus: int
    k_minus: int
    median: float
    maximum: float
    oracle_median: float
    canaries: int
    trials: int



@lru_cache(maxsize=16)
def ceiling_design(m: int, q: float, sigma: float, rounds: int, confidence: float = 0.95,
                   trials: int = DESIGN_TRIALS, seed: int = 0) -> Ceiling:
    """Simulate the certified mechanism's white-box scores (public parameters and a public
    seed, like :func:`design`) and report :class:`Ceiling`: with the likelihood-ratio score
    (the optimal score for one canary) and the best k fixed in advance, the median of the most
    any count-based one-run bound could prove. Below 2 it shows that no such method reaches 2
    at this (m, q, sigma, T) without a mechanism that leaks more than certified."""
    table: dict[tuple[int, int], list[float]] = {ks: [] for ks in _grid(m)}
    oracle = []
    for bits, coins, scores in _simulated_audits(m, q, sigma, rounds, trials, seed):
        for ks in table:
            r, v = count_correct(make_guesses(scores, k_plus=ks[0], k_minus=ks[1]), bits)
            table[ks].append(count_ceiling(r, v, confidence=confidence))
        seen = int(coins.any(axis=0).sum())
        oracle.append(count_ceiling(seen, seen, confidence=confidence))
    best = max(table, key=lambda ks: (float(np.median(table[ks])), -ks[0] - ks[1]))
    return Ceiling(best[0], best[1], float(np.median(table[best])), float(max(table[best])),
                   float(np.median(oracle)), m, trials)


@dataclass(frozen=True)
class OneRunBound(_Record):
    """Steinke et al.'s bound: m canaries scored, r guesses, v correct, how k was fixed."""

    epsilon_lower_bound: float
    m: int
    k_plus: int
    k_minus: int
    r: int
    v: int
    selection: str
    confidence: float



def one_run_bound(scores: np.ndarray, included: np.ndarray, *, delta: float,
                  confidence: float = 0.95, selection: str = "half",
                  ks: tuple[int, int] | None = None, seed: int = 0) -> OneRunBound:
    """The one-run bound with k fixed by ``ks`` (``selection="design"`` or ``"fixed"``) or, for
    ``"half"``, chosen on a public random half of the canaries and applied to the other half."""
    inc = np.asarray(included, dtype=bool)
    if selection != "half":
        if ks is None:
            raise ValueError(f"selection {selection!r} needs (k_plus, k_minus) fixed in advance")
        eps, r, v = _bound(scores, inc, ks, delta, confidence)
        return OneRunBound(eps, scores.size, ks[0], ks[1], r, v, selection, confidence)
    order = np.random.default_rng(seed).permutation(scores.size)   # public split
    a, b = order[: scores.size // 2], order[scores.size // 2:]
    chosen = max(_grid(a.size), key=lambda k: _bound(scores[a], inc[a], k, delta, confidence,
                                                     tol=1e-3)[0])
    eps, r, v = _bound(scores[b], inc[b], chosen, delta, confidence)
    return OneRunBound(eps, b.size, chosen[0], chosen[1], r, v, "half", confidence)


@dataclass(frozen=True)
class Calibration(_Record):
    """Audit mode's test: measured/certified mu and noise scale, and whether either is off."""

    mu: float
    mu_certified: float
    mu_ratio: float
    noise_scale: float
    tolerance: float            # on mu / mu_certified - 1
    scale_tolerance: float      # on noise_scale - 1
    flagged: bool



def calibration(rounds: np.ndarray, included: np.ndarray, *, sigma: float,
                tolerance: float = CALIBRATION_TOLERANCE) -> Calibration:
    """Compare the measured mu with sqrt(T)/sigma, and the noise scale with 1 (sigma C / (q n)
    in known units); meaningful at q = 1 (audit mode), where every included canary is in
    every round.

    The noise scale is the spread of the excluded canaries' per-round projections, pooled over
    the T rounds (T K/2 values: about 0.9% relative error at K = 1,000, T = 12); mu is the mean
    shift of the sum statistic over that scale (about 1%). Each is flagged when it is off by
    more than ``tolerance`` or by five of its standard errors, whichever is larger, so a correct
    mechanism is flagged with probability of about 1e-6 (normal approximation) at any K, and at
    K = 1,000 the tolerance is the 5% of the goal.
    """
    inc = np.asarray(included, dtype=bool)
    n_in, n_out = int(inc.sum()), int((~inc).sum())
    if n_in < 2 or n_out < 2:
        return Calibration(math.nan, math.nan, math.nan, math.nan, tolerance, tolerance, True)
    stat = sum_statistic(rounds)
    scale = float(rounds[:, ~inc].std(ddof=1))
    mu = float((stat[inc].mean() - stat[~inc].mean()) / scale)
    mu0 = math.sqrt(rounds.shape[0]) / sigma
    se_scale = 1.0 / math.sqrt(2.0 * (rounds.shape[0] * n_out - 1))
    se_mu = math.sqrt((1.0 / n_in + 1.0 / n_out) / mu0 ** 2 + se_scale ** 2)
    tol_mu, tol_scale = max(tolerance, 5 * se_mu), max(tolerance, 5 * se_scale)
    off = abs(mu / mu0 - 1.0) > tol_mu or abs(scale - 1.0) > tol_scale
    return Calibration(mu, mu0, mu / mu0, scale, tol_mu, tol_scale,
                       bool(off or not math.isfinite(mu)))


def analytic(q: float, sigma: float, rounds: int, delta: float, *,
             bound_delta: float | None = None) -> dict:
    """What the certificate implies for the same observations: the white-box epsilon (PLD of
    T subsampled Gaussians, the accountant's own figure) at the run's delta and at the one-run
    bound's delta (what a lower bound at that delta is compared with), and the Gaussian
    statistic's mu."""
    mu = q * math.sqrt(rounds) / sigma
    events = [RoundEvent(q, sigma, rounds)]
    at_delta = epsilon(events, delta)
    bound_delta = delta if bound_delta is None else bound_delta
    return {"whitebox_epsilon": at_delta, "bound_delta": bound_delta,
            "certified_epsilon_at_bound_delta": (at_delta if bound_delta == delta
                                                 else epsilon(events, bound_delta)),
            "statistic_mu": mu, "statistic_epsilon": gdp_epsilon(mu, delta)}


__all__ = ["Calibration", "Ceiling", "GaussianFit", "OneRunBound", "analytic", "calibration",
           "ceiling_design", "count_ceiling", "design", "gaussian_fit", "gdp_epsilon",
           "llr_scores", "one_run_bound", "sum_statistic"]
