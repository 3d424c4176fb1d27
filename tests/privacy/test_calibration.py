"""Sigma calibration at large T: the coarse search's bracketing never leaves (0, 1e4]."""

from __future__ import annotations

import pytest

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy import calibration
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.privacy.calibration import _bracket_decreasing, _NoBracket, calibrate


def _reciprocal_gap(root: float, seen: list[float]):
    """A cheap decreasing stand-in for the epsilon gap: c / x - c / root (like eps ~ 1/sigma)."""
    def f(x: float) -> float:
        seen.append(x)
        return 100.0 / x - 100.0 / root
    return f


@pytest.mark.parametrize("x0", [0.01, 1.0, 45.0, 164.0, 9999.0])
def test_bracket_of_a_decreasing_function_holds_the_root_and_stays_positive(x0):
    seen: list[float] = []
    f = _reciprocal_gap(45.0, seen)
    lo, hi = _bracket_decreasing(f, x0, floor=1e-3, ceiling=1e4)
    assert f(lo) > 0 >= f(hi) and lo < 45.0 <= hi <= 2 * lo
    assert min(seen) >= 1e-3 and max(seen) <= 1e4


def test_a_newton_step_from_far_above_the_root_goes_negative_and_the_bracket_does_not():
    """The bug at T = 10^6: a Newton step from 3.6x the root of c/x - t lands at x (2 - x/r)
    < 0, the sigma = -434 that RoundEvent refused; the geometric bracket never does."""
    root, x0 = 45.0, 164.0
    slope = -100.0 / x0 ** 2
    assert x0 - (100.0 / x0 - 100.0 / root) / slope < 0
    seen: list[float] = []
    lo, hi = _bracket_decreasing(_reciprocal_gap(root, seen), x0, floor=1e-3, ceiling=1e4)
    assert (lo, hi) == (41.0, 82.0) and min(seen) > 0


def test_bracket_reports_which_end_it_reached():
    with pytest.raises(_NoBracket) as up:
        _bracket_decreasing(lambda x: 1.0, 3.0, floor=0.5, ceiling=100.0)
    assert not up.value.at_floor and up.value.x == 100.0
    with pytest.raises(_NoBracket) as down:
        _bracket_decreasing(lambda x: -1.0, 3.0, floor=0.5, ceiling=100.0)
    assert down.value.at_floor and down.value.x == 0.5
    with pytest.raises(ValueError):
        _bracket_decreasing(lambda x: 1.0, 0.0, floor=0.0, ceiling=1.0)


def test_calibration_at_large_T_is_positive_and_never_overshoots():
    """n = 40, m = 4, epsilon = 8: at T = 3e5 the 1e-2 grid's root (~49) is twice the exact
    one (~24.8) and the old Newton step tried sigma = -6.5; T = 10^6 tried -434."""
    rounds = 300_000
    cal = calibrate(40, 4, rounds, 8.0, parallel=False)
    assert 20.0 < cal.sigma < 30.0
    assert cal.epsilon <= 8.0 < cal.epsilon_below
    assert cal.sigma_below < cal.sigma <= cal.sigma_below * (1 + 1e-6)
    assert compute_epsilon(40, 4, rounds, cal.sigma).epsilon <= 8.0


def test_a_target_missed_on_the_coarse_grid_at_the_ceiling_is_still_reached():
    """The 1e-2 grid states epsilon 0.139 at sigma = 1e4 and T = 1e5 where the exact grid
    states 0.0024: 0.1 was called unreachable; it is met near sigma = 461."""
    cal = calibrate(40, 4, 100_000, 0.1, parallel=False)
    assert 100.0 < cal.sigma < 1e4 and cal.epsilon <= 0.1 < cal.epsilon_below


def test_an_exactly_unreachable_target_is_refused_quickly(eps_evaluations):
    seen = eps_evaluations
    with pytest.raises(PrivacyBudgetError, match="unreachable: sigma would exceed 10000"):
        calibrate(40, 4, 100_000, 1e-3, parallel=False)
    assert seen.count((1e4, calibration.DEFAULT_DISCRETIZATION)) == 1  # the one exact check
    assert min(sigma for sigma, _ in seen) >= 1.0
