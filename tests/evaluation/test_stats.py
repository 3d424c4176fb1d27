"""Tests of dpgrpo.evaluation.stats against scipy, statsmodels, enumeration and the paper."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from dpgrpo.evaluation import stats as S


def _exact_mean_distribution(d: list[float]) -> dict[float, float]:
    """Exact bootstrap distribution of the mean by enumerating all n^n resamples."""
    n, dist = len(d), {}
    for idx in itertools.product(range(n), repeat=n):
        m = round(sum(d[i] for i in idx) / n, 12)
        dist[m] = dist.get(m, 0.0) + n ** -n
    return dist


# ---------------------------------------------------------------- McNemar and Holm

@pytest.mark.parametrize("seed", range(6))
def test_mcnemar_matches_scipy_binomtest(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    a = rng.random(n) < rng.uniform(0.2, 0.8)
    b = np.where(rng.random(n) < 0.2, ~a, a)
    res = S.mcnemar_exact(a, b)
    n01, n10 = int((a & ~b).sum()), int((~a & b).sum())
    assert (res.a_only, res.b_only) == (n01, n10)
    expected = sps.binomtest(n01, n01 + n10, 0.5).pvalue if n01 + n10 else 1.0
    assert res.p == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_mcnemar_hand_cases() -> None:
    same = np.array([True, False, True])
    assert S.mcnemar_exact(same, same).p == 1.0
    # b = 5, c = 0: p = 2 * 0.5^5 = 0.0625
    a = np.array([True] * 5 + [False] * 3)
    b = np.array([False] * 5 + [False] * 3)
    assert S.mcnemar_exact(a, b).p == pytest.approx(0.0625)
    # b = c: p = 1 (capped)
    assert S.mcnemar_exact([1, 0], [0, 1]).p == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_holm_matches_statsmodels(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.random(int(rng.integers(1, 12))) ** 3
    if p.size > 2:
        p[1] = p[0]                                   # a tie
    expected = multipletests(p, method="holm")[1]
    np.testing.assert_allclose(S.holm(p), expected, rtol=1e-12)


def test_holm_hand_case() -> None:
    # sorted 0.01, 0.02, 0.04 -> 0.03, 0.04, 0.04 (monotone), returned in input order
    np.testing.assert_allclose(S.holm([0.04, 0.01, 0.02]), [0.04, 0.03, 0.04])


# ---------------------------------------------------------------- bootstrap

def test_bootstrap_distribution_matches_enumeration() -> None:
    d = [1.0, 0.0, -1.0, 0.5]
    exact = _exact_mean_distribution(d)
    draws = S.bootstrap_means(np.array(d), draws=200_000, seed=3)
    values, counts = np.unique(np.round(draws, 12), return_counts=True)
    assert set(values.tolist()) <= set(exact)
    for v, c in zip(values.tolist(), counts.tolist()):
        assert c / draws.size == pytest.approx(exact[v], abs=0.004)


def test_bootstrap_interval_tiny_enumerable_case() -> None:
    # d = (1, 0, 0): mean in {0, 1/3, 2/3, 1} w.p. (8, 12, 6, 1)/27, so P(<= 2/3) = 0.963
    # < 0.975 and P(0) = 0.296 > 0.025: the 95% interval is exactly [0, 100] pp.
    lo, hi = S.bootstrap_interval([[1, 0, 0]], [[0, 0, 0]], draws=50_000, seed=1)
    assert (lo, hi) == (0.0, 100.0)


def test_bootstrap_averages_seeds_within_problem() -> None:
    a = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=bool)
    b = np.zeros((2, 4), dtype=bool)
    np.testing.assert_allclose(S.problem_differences(a, b), [1.0, 0.5, 0.0, 0.0])


def test_bootstrap_interval_covers_known_difference() -> None:
    # exactly 160 problems A-only and 60 B-only over 2,000: Delta = 5.0 pp
    a = np.zeros(2000, dtype=bool)
    b = np.zeros(2000, dtype=bool)
    a[:160] = True
    b[160:220] = True
    lo, hi = S.bootstrap_interval(a, b, draws=20_000, seed=7)
    d = a.astype(float) - b
    se = 100 * d.std(ddof=1) / math.sqrt(d.size)
    assert lo < 5.0 < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.05)


def test_bootstrap_interval_coverage_is_near_nominal() -> None:
    rng = np.random.default_rng(11)
    true_delta, hits, reps = 0.03, 0, 300            # d_j in {-1, 0, 1}, mean 0.03
    for r in range(reps):
        d = rng.choice([-1.0, 0.0, 1.0], size=400, p=[0.085, 0.8, 0.115])
        m = S.bootstrap_means(d, draws=2_000, seed=r)
        lo, hi = np.quantile(m, [0.025, 0.975])
        hits += lo <= true_delta <= hi
    assert 0.90 <= hits / reps <= 0.99


def test_bootstrap_memory_bound_chunks_give_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    d = np.random.default_rng(0).choice([-1.0, 0.0, 1.0], size=500)
    full = S.bootstrap_means(d, draws=1_000, seed=5)
    monkeypatch.setattr(S, "_CHUNK_CELLS", 30)       # 10 draws per chunk
    chunked = S.bootstrap_means(d, draws=1_000, seed=5)
    assert full.shape == chunked.shape == (1_000,)
    assert abs(full.mean() - chunked.mean()) < 0.01   # same distribution, new stream


# ---------------------------------------------------------------- sign randomization

def test_sign_randomization_matches_enumeration() -> None:
    d = np.array([1.0, 1.0, 1.0, -1.0, 0.5, 1.0, 0.0, -0.5])
    observed = abs(d.sum())
    sums = [abs(np.dot(s, d)) for s in itertools.product([-1, 1], repeat=d.size)]
    exact = np.mean(np.array(sums) >= observed - 1e-12)
    p = S.sign_randomization_pvalue(d, draws=200_000, seed=2)
    assert p == pytest.approx(exact, abs=0.004)


def test_sign_randomization_plus_one_correction_and_edges() -> None:
    strong = np.ones(200)                             # every flip gives |sum| < 200 but one
    assert S.sign_randomization_pvalue(strong, draws=999, seed=0) == pytest.approx(1 / 1000)
    assert S.sign_randomization_pvalue(np.zeros(5), draws=10, seed=0) == 1.0
    assert S.sign_randomization_pvalue(np.array([1.0, -1.0]), draws=100, seed=0) == 1.0


# ---------------------------------------------------------------- MDE and seeds

def test_mde_by_hand() -> None:
    d = np.array([1.0, 0.0, -1.0, 1.0])
    sd = math.sqrt(((0.75**2) + 0.25**2 + 1.25**2 + 0.75**2) / 3)
    expected = (1.959963984540054 + 0.8416212335729143) * 100 * sd / 2
    assert S.minimum_detectable_effect(d) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(134.115, abs=1e-3)


def _rows_with_rates(counts: list[int], n: int = 10_000) -> np.ndarray:
    rows = np.zeros((len(counts), n), dtype=bool)
    for i, c in enumerate(counts):
        rows[i, :c] = True
    return rows


@pytest.mark.parametrize(("counts", "sd", "interval"), [
    ([231, 316, 262, 251], 0.36, (2.08, 3.22)),     # Table XI MATH, DP-GRPO - control
    ([326, 281, 265, 425], 0.72, (2.10, 4.38)),     # Table XI GSM8K, DP-GRPO - control
])
def test_seed_level_summary_reproduces_paper(counts, sd, interval) -> None:
    a, b = _rows_with_rates(counts), np.zeros((4, 10_000), dtype=bool)
    res = S.seed_differences(a, b)
    np.testing.assert_allclose(res.diffs, np.array(counts) / 100)
    # the paper's per-seed differences are rounded to 0.01, so agreement is to ~0.01
    assert res.sd == pytest.approx(sd, abs=0.006)
    np.testing.assert_allclose(res.t_interval, interval, atol=0.012)
    ref = sps.t.interval(0.95, 3, loc=np.mean(res.diffs), scale=sps.sem(res.diffs))
    np.testing.assert_allclose(res.t_interval, ref, rtol=1e-12)


def test_single_seed_pair_has_no_t_interval() -> None:
    res = S.seed_differences([1, 1, 0, 0], [1, 0, 0, 0])
    assert res.diffs == (25.0,) and res.sd is None and res.t_interval is None


def test_pair_seeds_broadcasts_base_and_truncates() -> None:
    four, two, one = (np.eye(4, 6, dtype=bool)), np.ones((2, 6), bool), np.zeros((1, 6), bool)
    a, b = S.pair_seeds(four, one)
    assert a.shape == b.shape == (4, 6)
    a, b = S.pair_seeds(four, two)
    assert a.shape == (2, 6) and np.array_equal(a, four[:2])
    with pytest.raises(ValueError):
        S.pair_seeds(np.ones((1, 3), bool), np.ones((1, 4), bool))
    with pytest.raises(ValueError):
        S.as_correctness([[0, 2]])


# ---------------------------------------------------------------- Contrast

def _synthetic(seed: int, n: int = 1500, lift: float = 0.04) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.random(n) < 0.5
    b = np.array([base ^ (rng.random(n) < 0.05) for _ in range(4)])
    a = np.array([(r | (rng.random(n) < lift)) for r in b])
    return a, b


def test_contrast_is_consistent_with_its_parts() -> None:
    a, b = _synthetic(0)
    c = S.contrast(a, b, draws=5_000, sign_draws=20_000, seed=9)
    d = S.problem_differences(a, b)
    assert c.difference == pytest.approx(100 * d.mean())
    assert c.difference == pytest.approx(np.mean(c.seeds.diffs))
    assert c.ci == S.bootstrap_interval(a, b, draws=5_000, seed=9)
    assert c.ci[0] < c.difference < c.ci[1] and c.ci[0] > 0 and c.mde is None
    assert [t.p for t in c.mcnemar] == [S.mcnemar_exact(a[i], b[i]).p for i in range(4)]
    np.testing.assert_allclose(c.holm_p, multipletests([t.p for t in c.mcnemar], method="holm")[1])
    assert c.sign_p == S.sign_randomization_pvalue(d, draws=20_000, seed=9)
    assert c.sign_p == pytest.approx(1 / 20_001)
    assert (c.bootstrap_seed, c.bootstrap_draws, c.n_seed_pairs) == (9, 5_000, 4)
    assert c.accuracy_a - c.accuracy_b == pytest.approx(c.difference)
    out = json.loads(json.dumps(c.to_dict()))
    assert out["ci"] == list(c.ci) and out["mcnemar_p"] == [t.p for t in c.mcnemar]


def test_contrast_null_effect_reports_mde() -> None:
    a, b = _synthetic(1, lift=0.0)
    c = S.contrast(a, b, draws=5_000, sign_draws=5_000, seed=1)
    if not c.ci_contains_zero:                       # seed-dependent; this seed covers zero
        pytest.fail(f"expected an interval containing 0, got {c.ci}")
    assert c.mde == pytest.approx(S.minimum_detectable_effect(S.problem_differences(a, b)))
    assert c.mde == pytest.approx(2.8015852 * c.se, rel=1e-6)
    assert c.sign_p > 0.05


def test_adjust_family_pools_tests() -> None:
    cs = [S.contrast(*_synthetic(s, lift=0.01 * s), draws=500, sign_draws=500) for s in (1, 2)]
    adj = S.adjust_family(cs)
    flat = [t.p for c in cs for t in c.mcnemar]
    np.testing.assert_allclose([p for c in adj for p in c.holm_p], S.holm(flat))
    assert all(len(c.holm_p) == 4 for c in adj)


# --- claims over runs: seeds then problems (issue 55) --------------------------------------

def _rows(accuracies: list[float], n: int = 200) -> np.ndarray:
    """One row per seed, the first round(acc * n) problems correct."""
    return np.array([[j < round(acc * n) for j in range(n)] for acc in accuracies])


def test_seeds_and_problems_interval_counts_the_spread_between_runs():
    """The study's three seeds (issue 55): DP-GRPO 44.5 / 77.5 / 71.0 against the control's
    58.0 / 48.5 / 38.5. Over problems alone +16.0 pp excludes 0; once the seeds are resampled
    too it holds 0, and Welch's t over the seeds gives p = 0.257."""
    from dpgrpo.evaluation.stats import contrast

    dp, control = _rows([0.445, 0.775, 0.71]), _rows([0.58, 0.485, 0.385])
    c = contrast(dp, control, draws=20_000, sign_draws=1_000)
    assert c.difference == pytest.approx(16.0, abs=0.01)
    assert c.ci[0] > 0                                      # problems only: "significant"
    assert c.ci_runs is not None and c.ci_runs[0] < 0 < c.ci_runs[1]
    assert c.ci_runs[1] - c.ci_runs[0] > 2.5 * (c.ci[1] - c.ci[0])
    assert c.seed_p == pytest.approx(0.2566, abs=1e-3) and c.n_seeds == (3, 3)
    assert c.to_dict()["ci_runs"] == list(c.ci_runs)


def test_seed_resampling_has_the_binomial_spread_and_vanishes_without_spread():
    """Ten runs that each solve all or nothing (half of them), against a fixed model at 50%:
    the seed level alone has sd sqrt(0.25 / 10) = 0.158. Identical seeds give back the
    problem-only interval."""
    from dpgrpo.evaluation.stats import bootstrap_means, hierarchical_bootstrap_means

    runs = _rows([1.0] * 5 + [0.0] * 5, n=100)
    fixed = _rows([0.5], n=100)
    means = hierarchical_bootstrap_means(runs, fixed, draws=40_000, seed=1)
    assert means.mean() == pytest.approx(0.0, abs=0.005)
    assert means.std() == pytest.approx(np.sqrt(0.25 / 10), rel=0.05)
    same = _rows([0.6] * 4, n=100)
    two = hierarchical_bootstrap_means(same, fixed, draws=40_000, seed=2)
    one = bootstrap_means(same[0].astype(float) - fixed[0].astype(float), draws=40_000, seed=2)
    assert two.std() == pytest.approx(one.std(), rel=0.05)


def test_one_seed_each_has_no_interval_over_runs_and_no_seed_test():
    from dpgrpo.evaluation.stats import contrast, seed_test

    c = contrast(_rows([0.7]), _rows([0.5]), draws=2_000, sign_draws=1_000)
    assert c.ci_runs is None and c.seed_p is None and c.n_seeds == (1, 1)
    # against a fixed model (one row): the one-sample t-test of the runs' accuracies
    from scipy import stats as sps

    p = seed_test(_rows([0.6, 0.7, 0.65, 0.8]), _rows([0.5]))
    assert p == pytest.approx(sps.ttest_1samp([0.6, 0.7, 0.65, 0.8], 0.5).pvalue)
    assert seed_test(_rows([0.6, 0.6]), _rows([0.5, 0.5])) is None   # no spread to test
