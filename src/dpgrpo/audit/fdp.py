"""The f-DP one-run lower bound of the white-box audit (Mahloujifar, Melis and Chaudhuri 2024;
Xiang et al. 2025, "tight audit in one run": order statistics of the most confident guesses).

The game is Steinke et al.'s: m canaries, each included with probability 1/2; after one run the
auditor scores each canary, guesses "in" or "out" by the score's sign, keeps only the ``r``
most confident guesses (abstains on the rest; r fixed in advance by a public rule) and counts
``u`` wrong ones among them. What changes is the null hypothesis: instead of "(epsilon,
delta)-DP", whose count-based test can never prove more than ``count_ceiling`` (114 of 114
correct prove at most 3.6), the null is one member of the certified mechanism's own trade-off
family, the Poisson-subsampled Gaussian composed over T rounds, ``f_{q, sigma', T}``, with q and
T the run's (public) and sigma' the free parameter. Its epsilon at a delta is what the PLD
accountant gives for (q, sigma', T): at sigma' = sigma it is the certified epsilon itself.

The null's channel. One canary's white-box observation is its T projections in noise units;
excluded: P = N(0, I_T); included: Q = prod_t ((1 - q) N(0, 1) + q N(mu', 1)), mu' = 1/sigma'.
The log-likelihood ratio L = sum_t log(1 - q + q exp(mu' y_t - mu'^2/2)) (the audit's own
score at mu' = 1/sigma) has a distribution under P and under Q that :func:`profile` computes by
discretizing one round's L on a grid of step ``h`` and composing T rounds by FFT.

The tail (Xiang et al.). The MAP guess at an outcome is wrong with probability
gamma = min(p, q) / (p + q); sort outcomes by confidence |L| and let G(w) be the error mass of
the mixture M = (P + Q)/2 above confidence quantile w, gammabar(w) = G(w) / (1 - w). With the
m canaries independent and each one's observation exactly the null's, the quantile W of the
best abstained canary is Beta(m - r, r + 1), the r kept guesses are then independent with error
probability gammabar(W), and ``P[U <= u] = E_W[BinomialCDF(u; r, gammabar(W))]``: the p-value
of observing u or fewer errors. Xiang et al. show that this is the fewest errors any mechanism
with that trade-off curve and any score can give, which makes it a test of the curve.

What is computed and what it proves. The bound is the epsilon (at the bound's delta) of the
largest mu' whose null is rejected at level 1 - confidence, found by bisection between mu_cert /
:data:`MU_RANGE` and mu_cert * MU_RANGE; its side of the certificate is fixed first by testing
the certified mu itself, so that "bound above the certificate" holds exactly when the
certificate's own curve is rejected. For a correct mechanism that happens with probability at
most 1 - confidence: its canaries (orthonormal directions, isotropic noise, independent Poisson
coins per slot) are independent draws of exactly that channel, and the p-value is exact up to
the grid (|L| within T h / 2). A bound above the certificate is therefore a bug at that
confidence. The bound's value is relative to the family: it says that the mechanism's curve is
not that of (q, sigma', T) for the rejected sigma', not that (epsilon, delta)-DP fails for
every mechanism; that is the price of reaching the certificate (docs/auditing.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
from scipy import fft, stats

#: Step of the log-likelihood-ratio grid; T rounds move |L| by at most T h / 2 (0.03 at T 12).
GRID_STEP = 0.005
#: One round's |L| above this is lumped into the top bin (its error probability < e^-60).
LOSS_CAP = 60.0
#: Bisection range of mu' below the certified mu (a factor) and above it (a bound above the
#: certificate flags the mechanism anyway: up to sigma/2, "at least" beyond), and resolution.
MU_RANGE = 8.0
MU_ABOVE = 2.0
MU_TOLERANCE = 0.002
#: The PLD grid for epsilons above the certificate's (the accountant's default there takes
#: minutes at sigma/2 and eps ~ 60; the verdict does not depend on the figure).
COARSE_DISCRETIZATION = 1e-2
#: Quadrature points over the Beta law of the cut.
BETA_POINTS = 2000
#: The audit's verdict flags the mechanism when the certified curve's p-value is below this
#: (the bound itself is reported at its own confidence, 95% by default, whose 5% false-alarm
#: rate would fail one correct audit in twenty).
FLAG_LEVEL = 1e-3


@dataclass(frozen=True)
class Profile:
    """The null channel's guesses sorted by confidence (ascending): per band its M-mass, the
    cumulative mass up to it (``w_hi``), its error probability and the error mass above it."""

    w_hi: np.ndarray
    gamma: np.ndarray
    g_above: np.ndarray
    error_rate: float           # G(0): the MAP decoder's error over all canaries

    def gbar(self, w: np.ndarray) -> np.ndarray:
        """Mean error probability of the guesses above confidence quantile ``w``."""
        w = np.clip(w, 0.0, 1.0)
        j = np.minimum(np.searchsorted(self.w_hi, w, side="right"), self.w_hi.size - 1)
        g = self.gamma[j] * np.maximum(self.w_hi[j] - w, 0.0) + self.g_above[j]
        return np.clip(g / np.maximum(1.0 - w, 1e-300), 0.0, 0.5)


def _round_masses(mu: float, q: float, h: float) -> tuple[np.ndarray, np.ndarray, int]:
    """One round's L on the grid k h: masses under P and under Q, and the lowest index k."""
    x_hi = mu + 12.0
    edges = np.linspace(-12.0 - (mu if q >= 1.0 else 0.0), x_hi, 400_001)
    x, dx = 0.5 * (edges[:-1] + edges[1:]), edges[1] - edges[0]
    shift = mu * x - 0.5 * mu * mu
    ell = shift if q >= 1.0 else np.logaddexp(math.log1p(-q), math.log(q) + shift)
    ell = np.clip(ell, -LOSS_CAP, LOSS_CAP)
    logp = stats.norm.logpdf(x)
    p, qm = np.exp(logp) * dx, np.exp(logp + ell) * dx
    k = np.rint(ell / h).astype(np.int64)
    lo = int(k.min())
    size = int(k.max()) - lo + 1
    return (np.bincount(k - lo, p, size) / p.sum(), np.bincount(k - lo, qm, size) / qm.sum(), lo)


def _compose(pmf: np.ndarray, rounds: int) -> np.ndarray:
    size = rounds * (pmf.size - 1) + 1
    n = fft.next_fast_len(size, real=True)
    out = fft.irfft(fft.rfft(pmf, n) ** rounds, n)[:size]
    return np.clip(out, 0.0, None)


@lru_cache(maxsize=256)
def profile(mu: float, q: float, rounds: int, h: float = GRID_STEP) -> Profile:
    """The confidence profile of T rounds of the subsampled Gaussian with signal mu (module
    doc). Cached: the bisection and the design visit the same mu' many times."""
    p1, q1, lo = _round_masses(mu, q, h)
    p, qq = _compose(p1, rounds), _compose(q1, rounds)
    loss = (np.arange(p.size) + rounds * lo) * h
    m = 0.5 * (p + qq)
    err = 0.5 * np.where(loss >= 0.0, p, qq)        # guess "in" at L >= 0, "out" below
    keep = m > 0
    loss, m, err = loss[keep], m[keep], err[keep]
    order = np.argsort(np.abs(loss), kind="stable")
    m, err = m[order] / m.sum(), err[order] / (p.sum() + qq.sum()) * 2.0
    w_hi = np.cumsum(m)
    w_hi[-1] = 1.0
    g_above = np.cumsum(err[::-1])[::-1] - err
    gamma = np.clip(err / np.maximum(m, 1e-300), 0.0, 0.5)
    return Profile(w_hi, gamma, np.maximum(g_above, 0.0), float(err.sum()))


@lru_cache(maxsize=64)
def _beta_nodes(m: int, r: int, points: int = BETA_POINTS) -> np.ndarray:
    """Equal-probability nodes of Beta(m - r, r + 1), the cut's confidence quantile."""
    return stats.beta.ppf((np.arange(points) + 0.5) / points, m - r, r + 1)


def p_value(prof: Profile, *, m: int, r: int, u: int) -> float:
    """P[at most u errors among the r most confident of m guesses] under the null (Xiang et
    al.'s order-statistics tail)."""
    if not 0 <= u <= r <= m or r < 1:
        raise ValueError(f"need 0 <= u <= r <= m and r >= 1, got u={u}, r={r}, m={m}")
    if r == m:
        return float(stats.binom.cdf(u, m, prof.error_rate))
    return float(np.mean(stats.binom.cdf(u, r, prof.gbar(_beta_nodes(m, r)))))


def guesses(scores: np.ndarray, included: np.ndarray, r: int) -> int:
    """Errors among the ``r`` most confident sign guesses (confidence |score|; ties by index,
    which does not depend on the bits)."""
    s = np.asarray(scores, dtype=np.float64)
    if np.isnan(s).any():
        raise ValueError("canary scores contain NaN; score every canary before guessing")
    top = np.argsort(-np.abs(s), kind="stable")[:r]
    return int(((s[top] >= 0.0) != np.asarray(included, dtype=bool)[top]).sum())


def _rejected(mu: float, q: float, rounds: int, m: int, r: int, u: int, beta: float) -> bool:
    return p_value(profile(round(mu, 6), q, rounds), m=m, r=r, u=u) <= beta


def largest_rejected_mu(*, mu_cert: float, q: float, rounds: int, m: int, r: int, u: int,
                        confidence: float) -> tuple[float, bool]:
    """(mu_hat, certified_rejected): the largest mu' rejected (0 if none in range), bisected on
    the side of mu_cert that the certified curve's own test fixes (module doc); above it the
    search stops at :data:`MU_ABOVE` mu_cert."""
    beta = 1.0 - confidence
    cert_rejected = _rejected(mu_cert, q, rounds, m, r, u, beta)
    if cert_rejected:
        lo, hi = mu_cert, mu_cert * MU_ABOVE
        if _rejected(hi, q, rounds, m, r, u, beta):
            return hi, True
    else:
        lo, hi = mu_cert / MU_RANGE, mu_cert
        if not _rejected(lo, q, rounds, m, r, u, beta):
            return 0.0, False
    while hi / lo - 1.0 > MU_TOLERANCE:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _rejected(mid, q, rounds, m, r, u, beta) else (lo, mid)
    return lo, cert_rejected


@dataclass(frozen=True)
class FdpBound:
    """The f-DP one-run bound: r guesses kept of m, u wrong, the largest rejected signal mu'
    (sigma' = 1/mu'), its epsilon at ``delta`` and whether the certified curve was rejected."""

    epsilon_lower_bound: float
    delta: float
    m: int
    r: int
    u: int
    mu_rejected: float
    mu_certified: float
    certified_rejected: bool
    p_certified: float
    confidence: float
    selection: str
    capped: bool = False        # every mu' up to MU_ABOVE mu_cert rejected: "at least"
    flag_level: float = FLAG_LEVEL

    @property
    def flagged(self) -> bool:
        """The certified curve rejected at :data:`FLAG_LEVEL` (the audit's verdict)."""
        return self.p_certified <= self.flag_level

    def to_dict(self) -> dict:
        return asdict(self) | {"flagged": self.flagged}


def epsilon_of_mu(mu: float, q: float, rounds: int, delta: float, *,
                  coarse: bool = False) -> float:
    """The PLD epsilon at ``delta`` of T rounds of the subsampled Gaussian with sigma = 1/mu
    (``coarse``: on the :data:`COARSE_DISCRETIZATION` grid, for figures above the
    certificate's)."""
    from dpgrpo.privacy.accounting import DEFAULT_DISCRETIZATION, RoundEvent, epsilon

    step = COARSE_DISCRETIZATION if coarse else DEFAULT_DISCRETIZATION
    return 0.0 if mu <= 0 else epsilon([RoundEvent(q, 1.0 / mu, rounds)], delta,
                                       value_discretization_interval=step)


def fdp_bound(scores: np.ndarray, included: np.ndarray, *, q: float, sigma: float, rounds: int,
              delta: float, r: int, confidence: float = 0.95,
              selection: str = "design") -> FdpBound:
    """The f-DP one-run bound of white-box scores (module doc); ``r`` fixed in advance."""
    m = int(np.asarray(scores).size)
    r = int(min(max(r, 1), m))
    u = guesses(scores, included, r)
    mu_cert = 1.0 / sigma
    mu_hat, cert_rejected = largest_rejected_mu(mu_cert=mu_cert, q=q, rounds=rounds, m=m, r=r,
                                                u=u, confidence=confidence)
    p_cert = p_value(profile(round(mu_cert, 6), q, rounds), m=m, r=r, u=u)
    eps = epsilon_of_mu(mu_hat, q, rounds, delta, coarse=mu_hat > mu_cert)
    return FdpBound(eps, delta, m, r, u, mu_hat, mu_cert, cert_rejected, p_cert, confidence,
                    selection, capped=mu_hat >= mu_cert * MU_ABOVE * (1 - 1e-12))


def r_grid(m: int) -> list[int]:
    """The candidate numbers of kept guesses: 12 values from 16 to m / 4, geometric."""
    return sorted({int(round(x)) for x in np.geomspace(16, max(m // 4, 17), 12)})  # noqa: RUF046 - round() of a numpy float is a float before NumPy 2


@lru_cache(maxsize=16)
def design_r(m: int, q: float, sigma: float, rounds: int, confidence: float = 0.95,
             trials: int = 8, seed: int = 0) -> tuple[int, float]:
    """The public rule for abstention: the r (guesses kept) whose median rejected mu' is
    largest over ``trials`` simulated audits of the certified mechanism (public parameters and
    a public seed only, like :func:`dpgrpo.audit.whitebox_stats.design`), and that median
    mu' over mu_cert."""
    from dpgrpo.audit.whitebox_stats import llr_scores

    rng = np.random.default_rng(seed)
    mu_cert = 1.0 / sigma
    table: dict[int, list[float]] = {r: [] for r in r_grid(m)}
    for _ in range(trials):
        bits = rng.random(m) < 0.5
        coins = (rng.random((rounds, m)) < q) & bits
        scores = llr_scores(rng.standard_normal((rounds, m)) + coins * mu_cert, q, sigma)
        order = np.argsort(-np.abs(scores), kind="stable")
        wrong = (scores[order] >= 0.0) != bits[order]
        for r in table:
            mu, _ = largest_rejected_mu(mu_cert=mu_cert, q=q, rounds=rounds, m=m, r=r,
                                        u=int(wrong[:r].sum()), confidence=confidence)
            table[r].append(mu / mu_cert)
    best = max(table, key=lambda r: (float(np.median(table[r])), -r))
    return best, float(np.median(table[best]))


__all__ = ["FdpBound", "Profile", "design_r", "epsilon_of_mu", "fdp_bound", "guesses",
           "largest_rejected_mu", "p_value", "profile", "r_grid"]
