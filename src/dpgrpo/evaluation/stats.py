"""Paired contrasts between evaluation arms (paper Section VII-E, Appendix C-C).

A *contrast* compares arm A with arm B on one shared evaluation set. Inputs are correctness
matrices of shape ``(seeds, problems)`` (bool), columns aligned to the same problem ids. Every
number returned in percentage points (pp) is ``100 *`` a difference of accuracies.

Notation used in the docstrings: ``A[s, j]``, ``B[s, j]`` are the correctness of seed ``s`` on
problem ``j``; ``n`` problems; ``k`` paired seeds; the per-problem pooled difference is

    d_j = mean_s A[s, j] - mean_s B[s, j]            (each arm's seeds averaged within a problem)

and the pooled contrast is ``Delta = 100 * mean_j d_j``.

Claims about training runs also need the spread between runs (seeds): RL runs are noisy and
often bimodal, and an interval over problems alone treats the seeds as fixed. Each contrast
therefore also carries ``ci_runs``, a two-level bootstrap that resamples each arm's seeds and
then the problems (:func:`hierarchical_bootstrap_means`), and ``seed_p``, Welch's t-test over
the seeds' accuracies (:func:`seed_test`).

Both resampling procedures are exact reductions of the textbook ones, which keeps 100,000
bootstrap draws and 1,000,000 sign flips over thousands of problems to about a second:

* bootstrap: a resample's mean depends only on how many times each *distinct* value of ``d``
  was drawn, and those counts are Multinomial(n, frequencies), so we draw the counts;
* sign randomization: ``sum_j e_j d_j`` with ``e_j = +-1`` equals, grouped by distinct
  ``|d_j| = v`` occurring ``n_v`` times, ``sum_v v (2 X_v - n_v)`` with X_v ~ Binomial(n_v, 1/2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import TYPE_CHECKING, cast

import numpy as np
from scipy import stats as _sps

from dpgrpo.config.json_types import JSON
from dpgrpo.evaluation.defaults import (
    DEFAULT_BOOTSTRAP_DRAWS,
    DEFAULT_SEED,
    DEFAULT_SIGN_DRAWS,
)

if TYPE_CHECKING:
    from dpgrpo.config.json_types import JSONValue

_CHUNK_CELLS = 1 << 22             # cells per random chunk: bounds memory to ~32 MiB per array


def as_correctness(x: object) -> np.ndarray:
    """Validate a correctness matrix: bool, shape ``(seeds, problems)``; 1-D means one seed."""
    arr = np.asarray(x)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"correctness must be (seeds, problems) with both >= 1, got {arr.shape}")
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError("correctness values must be boolean (0/1)")
        arr = arr.astype(bool)
    return arr


def pair_seeds(a: object, b: object) -> tuple[np.ndarray, np.ndarray]:
    """Align the seed rows of two arms into ``k`` seed pairs (Appendix D-A, Table XI).

    Equal seed counts pair row ``i`` with row ``i``. An arm with one row (e.g. the greedy
    public base) is repeated against every seed of the other. Otherwise the first
    ``min(k_A, k_B)`` rows of each are paired, as the paper pairs DP-GRPO seeds 1-2 with the
    two supervised seeds; callers order rows by seed.
    """
    a, b = as_correctness(a), as_correctness(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"arms cover different numbers of problems: {a.shape[1]} vs {b.shape[1]}")
    ka, kb = a.shape[0], b.shape[0]
    if ka == kb:
        return a, b
    if ka == 1:
        return np.repeat(a, kb, axis=0), b
    if kb == 1:
        return a, np.repeat(b, ka, axis=0)
    k = min(ka, kb)
    return a[:k], b[:k]


def problem_differences(a: object, b: object) -> np.ndarray:
    """Per-problem pooled differences ``d_j = mean_s A[s,j] - mean_s B[s,j]`` (fractions)."""
    a, b = pair_seeds(a, b)
    return a.mean(axis=0) - b.mean(axis=0)  # (n,)


def bootstrap_means(d: np.ndarray, *, draws: int, seed: int) -> np.ndarray:
    """Problem-cluster bootstrap distribution of ``mean_j d_j`` (``draws`` values, fractions).

    Each draw resamples the ``n`` problems with replacement; drawn as multinomial counts of
    the distinct values of ``d`` (exactly the same distribution), in memory-bounded chunks.
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 1 or d.size == 0 or draws < 1:
        raise ValueError("need a non-empty 1-D d and draws >= 1")
    values, counts = np.unique(d, return_counts=True)        # (K,), (K,)
    n, rng = d.size, np.random.default_rng(seed)
    out = np.empty(draws)
    chunk = max(1, _CHUNK_CELLS // values.size)
    for start in range(0, draws, chunk):
        m = min(chunk, draws - start)
        c = rng.multinomial(n, counts / n, size=m)            # (m, K) times each value drawn
        out[start:start + m] = (c @ values) / n
    return out


def hierarchical_bootstrap_means(a: object, b: object, *, draws: int, seed: int) -> np.ndarray:
    """Two-level bootstrap distribution of ``mean_s A - mean_s B`` (fractions): each draw
    resamples the seeds of each arm (training runs: independent across arms, so each arm's
    own, with replacement), then the ``n`` problems (once, shared by both arms, so the
    pairing by problem stays). An arm with one row (the greedy base, a fixed warm start) is
    not resampled over seeds. The spread between runs widens the interval, which a bootstrap
    over problems alone leaves out (RL runs are noisy and often bimodal).

    ``draw = (1/n) sum_j c_j (sum_s wA_s A[s, j] - sum_s wB_s B[s, j])`` with ``c ~
    Multinomial(n, 1/n)`` and ``w ~ Multinomial(k, 1/k) / k`` per arm.
    """
    a, b = as_correctness(a), as_correctness(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"arms cover different numbers of problems: {a.shape[1]} vs {b.shape[1]}")
    if draws < 1:
        raise ValueError("draws must be >= 1")
    fa, fb = a.astype(float), b.astype(float)                 # (ka, n), (kb, n)
    (ka, n), kb = a.shape, b.shape[0]
    rng = np.random.default_rng(seed)
    out = np.empty(draws)
    chunk = max(1, _CHUNK_CELLS // n)
    for start in range(0, draws, chunk):
        m = min(chunk, draws - start)
        wa = rng.multinomial(ka, np.full(ka, 1 / ka), size=m) / ka   # (m, ka)
        wb = rng.multinomial(kb, np.full(kb, 1 / kb), size=m) / kb   # (m, kb)
        d = wa @ fa - wb @ fb                                         # (m, n)
        c = rng.multinomial(n, np.full(n, 1 / n), size=m)             # (m, n)
        out[start:start + m] = (c * d).sum(axis=1) / n
    return out


def seed_test(a: object, b: object) -> float | None:
    """Two-sided p of a test over seeds (runs), not problems: Welch's t-test on the arms'
    per-seed accuracies; against an arm with one row (a fixed model) the one-sample t-test of
    the other arm's seeds against its accuracy. None when neither arm has two seeds, or when
    the seeds do not vary (no spread to test against)."""
    a, b = as_correctness(a), as_correctness(b)
    xa, xb = a.mean(axis=1), b.mean(axis=1)                  # (ka,), (kb,)
    if len(xa) < 2 and len(xb) < 2:
        return None
    if len(xa) >= 2 and len(xb) >= 2:
        if xa.std() == 0 and xb.std() == 0:
            return None
        return float(_sps.ttest_ind(xa, xb, equal_var=False).pvalue)
    many, one = (xa, xb[0]) if len(xa) >= 2 else (xb, xa[0])
    if many.std() == 0:
        return None
    return float(_sps.ttest_1samp(many, one).pvalue)


#: fewer seeds than this per trained arm: the study warns that a claim rests on few runs
MIN_SEEDS_FOR_CLAIM = 5


def bootstrap_interval(a: object, b: object, *, draws: int = DEFAULT_BOOTSTRAP_DRAWS,
                       seed: int = DEFAULT_SEED, level: float = 0.95) -> tuple[float, float]:
    """Percentile problem-cluster bootstrap interval for ``Delta`` in pp (Section VII-E).

    ``[q_{(1-level)/2}, q_{(1+level)/2}]`` of ``100 * mean_j d*_j`` over ``draws`` resamples of
    the problems; seeds are averaged within a problem before resampling.
    """
    means = bootstrap_means(problem_differences(a, b), draws=draws, seed=seed)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return 100 * float(lo), 100 * float(hi)


@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test of one seed pair: discordant counts and two-sided p."""

    a_only: int          # problems A solves and B does not
    b_only: int          # problems B solves and A does not
    p: float


def mcnemar_exact(a: object, b: object) -> McNemar:
    """Exact McNemar test for one seed pair (Section VII-E).

    With discordant counts ``b = #(A right, B wrong)``, ``c = #(A wrong, B right)``:
    ``p = min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)])``; ``p = 1`` when ``b + c = 0``.
    """
    a, b = as_correctness(a), as_correctness(b)
    if a.shape != b.shape or a.shape[0] != 1:
        raise ValueError("mcnemar_exact takes one seed of each arm over the same problems")
    n01 = int((a & ~b).sum())
    n10 = int((~a & b).sum())
    if n01 + n10 == 0:
        return McNemar(n01, n10, 1.0)
    p = min(1.0, 2.0 * float(_sps.binom.cdf(min(n01, n10), n01 + n10, 0.5)))
    return McNemar(n01, n10, p)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjustment within one family, in the input order.

    Sorting ``p_(1) <= ... <= p_(m)``: ``p~_(i) = max_{j<=i} min(1, (m - j + 1) p_(j))``.
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError("pvalues must be 1-D")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(stepped)
    return out


def sign_randomization_pvalue(d: object, *, draws: int = DEFAULT_SIGN_DRAWS,
                              seed: int = DEFAULT_SEED) -> float:
    """Two-sided sign-randomization p-value of the pooled difference (Section VII-E).

    Under H0 each per-problem difference ``d_j`` is symmetric about 0. With ``T = |sum_j d_j|``
    and ``T*_r = |sum_j e_rj d_j|`` for random signs ``e_rj = +-1``, r = 1..R:
    ``p = (1 + #{r: T*_r >= T}) / (R + 1)``. Drawn grouped by distinct ``|d_j|`` (see module).
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 1 or draws < 1:
        raise ValueError("need a 1-D d and draws >= 1")
    observed = abs(float(d.sum()))
    mags, counts = np.unique(np.abs(d[d != 0]), return_counts=True)  # (K,), (K,)
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    if mags.size == 0:
        return 1.0                                            # every T*_r = 0 >= T = 0
    rng, hits = np.random.default_rng(seed), 0
    chunk = max(1, _CHUNK_CELLS // mags.size)
    for start in range(0, draws, chunk):
        m = min(chunk, draws - start)
        pos = rng.binomial(counts, 0.5, size=(m, mags.size))  # (m, K) positive signs per value
        total = (2 * pos - counts) @ mags                     # (m,)
        hits += int((np.abs(total) >= observed - tol).sum())
    return (1 + hits) / (draws + 1)


def minimum_detectable_effect(d: object, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Two-sided minimum detectable effect in pp (Section VII-E).

    ``MDE = (z_{1-alpha/2} + z_{power}) * SE``, ``SE = 100 * sd(d_j, ddof=1) / sqrt(n)``, the
    normal-approximation standard error of the paired difference from per-problem differences.
    At alpha = 0.05 and 80% power the factor is 1.95996 + 0.84162 = 2.80158.
    """
    d = np.asarray(d, dtype=float)
    if d.size < 2:
        raise ValueError("MDE needs at least two problems")
    z = NormalDist().inv_cdf
    se = 100 * float(d.std(ddof=1)) / float(np.sqrt(d.size))
    return (z(1 - alpha / 2) + z(power)) * se


@dataclass(frozen=True)
class SeedSummary:
    """Per-seed differences (pp), their sd and a seed-level t interval (Section VII-E)."""

    diffs: tuple[float, ...]
    sd: float | None
    t_interval: tuple[float, float] | None


def seed_differences(a: object, b: object, *, level: float = 0.95) -> SeedSummary:
    """Per-seed-pair differences ``D_s = 100 (mean_j A[s,j] - mean_j B[s,j])``.

    ``sd`` is the sample sd (ddof=1) of ``D_s`` and the interval is
    ``mean(D) +- t_{(1+level)/2, k-1} * sd / sqrt(k)``; both are None for one seed pair.
    """
    a, b = pair_seeds(a, b)
    diffs = 100 * (a.mean(axis=1) - b.mean(axis=1))          # (k,)
    k = diffs.size
    if k < 2:
        return SeedSummary(tuple(float(x) for x in diffs), None, None)
    sd = float(diffs.std(ddof=1))
    half = float(_sps.t.ppf((1 + level) / 2, k - 1)) * sd / float(np.sqrt(k))
    mean = float(diffs.mean())
    return SeedSummary(tuple(float(x) for x in diffs), sd, (mean - half, mean + half))


@dataclass(frozen=True)
class Contrast:
    """One paired contrast A - B on a shared evaluation set (Section VII-E, Tables II, XI)."""

    n_problems: int
    n_seed_pairs: int
    accuracy_a: float                       # pp, pooled over the paired seeds of A
    accuracy_b: float                       # pp, pooled over the paired seeds of B
    difference: float                       # pp, 100 * mean_j d_j
    ci: tuple[float, float]                 # percentile problem-cluster bootstrap, pp
    level: float
    bootstrap_draws: int
    bootstrap_seed: int
    mcnemar: tuple[McNemar, ...]            # one per seed pair
    holm_p: tuple[float, ...]               # Holm-adjusted McNemar p within the family
    sign_p: float
    sign_draws: int
    sign_seed: int
    se: float                               # pp, sd(d_j) / sqrt(n)
    mde: float | None                       # pp, only when the interval contains 0
    seeds: SeedSummary
    # seeds (each arm's runs) then problems resampled (hierarchical_bootstrap_means), pp; the
    # headline interval of a claim about training runs. None with one seed in each arm.
    ci_runs: tuple[float, float] | None = None
    seed_p: float | None = None             # seed_test: Welch's t over the seeds' accuracies
    n_seeds: tuple[int, int] = (1, 1)       # rows (seeds) of A and of B behind ci_runs

    @property
    def ci_contains_zero(self) -> bool:
        return self.ci[0] <= 0.0 <= self.ci[1]

    def to_dict(self) -> JSON:
        """Plain JSON-ready dict (tuples become lists, NaN becomes None)."""
        out = jsonable(asdict(self))
        out["mcnemar_p"] = [m.p for m in self.mcnemar]
        out["ci_contains_zero"] = self.ci_contains_zero
        return out


def jsonable(x: object) -> JSONValue:
    """Recursively turn tuples into lists, NaN into None and numpy scalars into Python ones."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and x != x:
        return None
    return x


def contrast(a: object, b: object, *, draws: int = DEFAULT_BOOTSTRAP_DRAWS,
             sign_draws: int = DEFAULT_SIGN_DRAWS, seed: int = DEFAULT_SEED,
             level: float = 0.95, alpha: float = 0.05, power: float = 0.8) -> Contrast:
    """Every statistic of Section VII-E for arm A minus arm B.

    Seeds are paired by :func:`pair_seeds`; the Holm family is this contrast's seed-pair tests
    (use :func:`adjust_family` for a wider family, e.g. CommonsenseQA's eight tests).
    """
    rows_a, rows_b = as_correctness(a), as_correctness(b)
    ci_runs = None
    if max(rows_a.shape[0], rows_b.shape[0]) > 1:
        over = hierarchical_bootstrap_means(rows_a, rows_b, draws=draws, seed=seed)
        ci_runs = tuple(100 * float(x) for x in np.quantile(over, [(1 - level) / 2,
                                                                   (1 + level) / 2]))
    a, b = pair_seeds(a, b)
    d = a.mean(axis=0) - b.mean(axis=0)                      # (n,)
    means = bootstrap_means(d, draws=draws, seed=seed)
    lo, hi = (100 * float(x) for x in np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))
    tests = tuple(mcnemar_exact(a[s], b[s]) for s in range(a.shape[0]))
    se = 100 * float(d.std(ddof=1)) / float(np.sqrt(d.size)) if d.size > 1 else float("nan")
    mde = minimum_detectable_effect(d, alpha=alpha, power=power) if lo <= 0.0 <= hi else None
    return Contrast(
        n_problems=int(d.size), n_seed_pairs=int(a.shape[0]),
        accuracy_a=100 * float(a.mean()), accuracy_b=100 * float(b.mean()),
        difference=100 * float(d.mean()), ci=(lo, hi), level=level,
        bootstrap_draws=draws, bootstrap_seed=seed, mcnemar=tests,
        holm_p=tuple(float(x) for x in holm([t.p for t in tests])),
        sign_p=sign_randomization_pvalue(d, draws=sign_draws, seed=seed),
        sign_draws=sign_draws, sign_seed=seed, se=se, mde=mde,
        seeds=seed_differences(a, b, level=level),
        ci_runs=cast("tuple[float, float] | None", ci_runs),
        seed_p=seed_test(rows_a, rows_b),
        n_seeds=(int(rows_a.shape[0]), int(rows_b.shape[0])))


def adjust_family(contrasts: Sequence[Contrast]) -> list[Contrast]:
    """Holm-adjust the seed-pair McNemar tests of several contrasts as one family.

    Returns copies whose ``holm_p`` come from :func:`holm` over all their tests together.
    """
    flat = [t.p for c in contrasts for t in c.mcnemar]
    adjusted, out, i = holm(flat), [], 0
    for c in contrasts:
        k = len(c.mcnemar)
        out.append(replace(c, holm_p=tuple(float(x) for x in adjusted[i:i + k])))
        i += k
    return out
