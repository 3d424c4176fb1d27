"""The one-run epsilon lower bound (Steinke, Nasr and Jagielski, 2023)."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from scipy import stats

from dpgrpo.audit.one_run import (
    count_correct,
    epsilon_lower_bound,
    lower_bound_from_counts,
    make_guesses,
    one_run_audit,
    p_value,
    sweep_lower_bound,
)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def test_guesses_top_and_bottom_with_stable_ties():
    assert make_guesses([1.0, 1.0, 1.0], k_plus=1, k_minus=1).tolist() == [1, 0, -1]
    assert count_correct([1, 0, -1, -1], [True, True, False, True]) == (3, 2)
    with pytest.raises(ValueError):
        make_guesses([1.0, 2.0], k_plus=2, k_minus=1)


def test_guesses_exact():
    g = make_guesses([0.1, 5.0, 3.0, 3.0, -2.0, 0.0], k_plus=2, k_minus=2)
    assert g.tolist() == [0, 1, 1, 0, -1, -1]


@pytest.mark.parametrize("r,v,eps", [(10, 7, 0.0), (200, 150, 1.0), (200, 200, 4.0), (50, 0, 2.0)])
def test_p_value_pure_dp_is_the_binomial_tail(r, v, eps):
    q = math.exp(eps) / (1.0 + math.exp(eps))
    assert p_value(1000, r, v, eps, 0.0) == pytest.approx(stats.binom.sf(v - 1, r, q), rel=1e-12)


@pytest.mark.parametrize("m,r,v,eps,delta", [(1000, 200, 150, 1.0, 1e-5), (100, 40, 35, 2.0, 1e-3)])
def test_p_value_delta_term_against_brute_force(m, r, v, eps, delta):
    q = math.exp(eps) / (1.0 + math.exp(eps))
    f = lambda x: stats.binom.sf(x - 1, r, q)          # noqa: E731  P[B >= x]
    alpha = max((f(v - i) - f(v)) / i for i in range(1, v + 1))
    expected = min(1.0, f(v) + 2 * m * delta * alpha)
    assert p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-9)
    assert p_value(m, r, v, eps, delta) > p_value(m, r, v, eps, 0.0)


def test_closed_form_when_every_guess_is_right():
    # delta = 0, v = r: p = q^r, so the bound solves q = beta^(1/r)
    for r in (10, 50, 200):
        eps = lower_bound_from_counts(1000, r, r, delta=0.0, confidence=0.95)
        assert eps == pytest.approx(_logit(0.05 ** (1.0 / r)), abs=1e-5)
    assert lower_bound_from_counts(1000, 200, 200, delta=0.0, confidence=0.95) == pytest.approx(
        4.193, abs=1e-3)


def test_separable_scores_give_a_large_bound():
    rng = np.random.default_rng(1)
    included = rng.random(1000) < 0.5
    scores = included + 0.1 * rng.random(1000)          # every member above every non-member
    eps0 = epsilon_lower_bound(scores, included, k_plus=100, k_minus=100, delta=0.0)
    eps = epsilon_lower_bound(scores, included, k_plus=100, k_minus=100, delta=1e-5)
    assert eps0 == pytest.approx(4.193, abs=1e-3)
    assert 3.0 < eps < eps0                            # the delta term costs something
    res = one_run_audit(scores, included, k_plus=100, k_minus=100, delta=1e-5)
    assert (res.m, res.r, res.v) == (1000, 200, 200) and res.epsilon_lower_bound == eps


def test_random_scores_give_zero_almost_always():
    rng = np.random.default_rng(2)
    positive = 0
    for _ in range(200):
        included = rng.random(500) < 0.5
        eps = epsilon_lower_bound(rng.random(500), included, k_plus=50, k_minus=50,
                                  delta=1e-5, confidence=0.95)
        assert eps < 0.6
        positive += eps > 0
    assert positive <= 20                               # valid at 95%: about 5% or fewer


def test_monotone_in_correct_guesses():
    bounds = [lower_bound_from_counts(1000, 200, v, delta=1e-5, confidence=0.95)
              for v in range(100, 201, 5)]
    assert all(b1 <= b2 for b1, b2 in pairwise(bounds))
    assert bounds[0] == 0.0 and bounds[-1] > 3.0
    assert all(b1 < b2 for b1, b2 in pairwise(bounds[6:]))  # strictly once positive
    # higher confidence, smaller bound
    assert lower_bound_from_counts(1000, 200, 180, delta=1e-5, confidence=0.99) < \
        lower_bound_from_counts(1000, 200, 180, delta=1e-5, confidence=0.95)


def test_bound_is_valid_at_its_own_p_value():
    eps = lower_bound_from_counts(1000, 200, 170, delta=1e-5, confidence=0.95)
    assert p_value(1000, 200, 170, eps, 1e-5) < 0.05 <= p_value(1000, 200, 170, eps + 1e-5, 1e-5)


def test_sweep_applies_bonferroni():
    rng = np.random.default_rng(3)
    included = rng.random(1000) < 0.5
    scores = included + 0.1 * rng.random(1000)
    ks = [(50, 50), (100, 100)]
    best = sweep_lower_bound(scores, included, ks=ks, delta=0.0, confidence=0.95)
    assert best.tests == 2 and best.k_plus == 100
    assert best.epsilon_lower_bound == pytest.approx(_logit(0.025 ** (1 / 200)), abs=1e-5)
