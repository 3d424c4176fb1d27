"""The AUC ceiling of a certificate: exact for Gaussian DP, above it by little, monotone in the
noise, and the limits (no rounds: a coin; a noiseless round: everything)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgrpo.privacy.accounting import RoundEvent
from dpgrpo.privacy.tradeoff import auc_ceiling, gaussian_auc, tradeoff_curve


@pytest.mark.parametrize("sigma,rounds", [(1.0, 1), (1.994, 20), (4.0, 5)])
def test_without_subsampling_the_ceiling_is_the_gaussian_dp_area(sigma, rounds):
    """q = 1: T Gaussian rounds are exactly mu-GDP with mu = sqrt(T) / sigma, whose trade-off
    area is Phi(mu / sqrt 2). The ceiling is an upper bound within the grids' error."""
    exact = gaussian_auc(math.sqrt(rounds) / sigma)
    ceiling = auc_ceiling([RoundEvent(1.0, sigma, rounds)])
    assert exact <= ceiling <= exact + 1e-3


def test_the_curve_is_the_gaussian_curve_point_by_point():
    from statistics import NormalDist

    alpha, tpr = tradeoff_curve([RoundEvent(1.0, 1.0, 1)], alphas=101)
    nd = NormalDist()
    exact = np.array([nd.cdf(nd.inv_cdf(a) + 1.0) if 0 < a < 1 else a for a in alpha])
    assert np.all(tpr >= exact - 1e-9) and np.max(tpr - exact) < 5e-3
    assert np.all(np.diff(tpr) >= -1e-12) and tpr[0] < 1e-9 and tpr[-1] == 1.0  # delta(top) ~ 1e-12


def test_more_noise_or_more_subsampling_lowers_the_ceiling_and_none_is_a_coin():
    strong = auc_ceiling([RoundEvent(0.25, 2.0, 10)])
    weak = auc_ceiling([RoundEvent(0.25, 1.0, 10)])
    full = auc_ceiling([RoundEvent(1.0, 1.0, 10)])
    assert 0.5 < strong < weak < full < 1.0
    assert auc_ceiling([]) == pytest.approx(0.5, abs=1e-3)         # no round: no test beats a coin
    assert auc_ceiling([RoundEvent(0.0, 1.0, 5)]) == pytest.approx(0.5, abs=1e-3)   # never sampled
    assert auc_ceiling([RoundEvent(1.0, 0.0, 1)]) == 1.0            # a noiseless round on the data


def test_gaussian_auc_limits():
    assert gaussian_auc(0.0) == 0.5 and gaussian_auc(10.0) > 0.99999
    with pytest.raises(ValueError):
        gaussian_auc(-1.0)
