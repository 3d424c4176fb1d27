"""Accounting: the paper's Tables VI/VII, the JAX-Privacy reference, properties, calibration."""

from __future__ import annotations

import json
import math

import pytest

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy.accounting import (
    PrivacyLedger,
    RoundEvent,
    compute_epsilon,
    default_delta,
    group_epsilon,
    group_privacy,
    pld_epsilon,
    replace_one,
    replace_one_epsilon,
)
from dpgrpo.privacy.calibration import calibrate

# (n, m, sigma at full precision (Table VII), T, PLD eps (Table VI), RDP eps, RDP order)
TABLE_VI = [
    ("MATH eps=1", 6988, 128, 1.0023417361080647, 50, 1.000, 1.463, 7.6),
    ("MATH eps=4.23", 6988, 128, 0.612058477104, 50, 4.235, 5.322, 3.2),
    ("MATH reference", 6988, 128, 0.4842404738068581, 50, 8.000, 9.830, 2.3),
    ("MATH DP-SFT T=100", 6988, 128, 0.519267738191411, 100, 8.000, 9.702, 2.3),
    ("MATH coverage", 6988, 512, 0.7022244453430175, 50, 8.000, 9.323, 2.6),
    ("MATH hist. rank-4", 6988, 128, 0.612058477104, 100, 5.038, 6.185, 3.0),
    ("GSM8K, CSQA", 6961, 128, 0.5196564674377442, 100, 8.000, 9.701, 2.3),
]


@pytest.mark.parametrize("name,n,m,sigma,rounds,pld,rdp,order", TABLE_VI,
                         ids=[r[0] for r in TABLE_VI])
def test_paper_table_vi(name, n, m, sigma, rounds, pld, rdp, order):
    report = compute_epsilon(n, m, rounds, sigma)
    assert report.delta == pytest.approx(1 / (10 * n))
    assert round(report.epsilon, 3) == pytest.approx(pld, abs=1e-9)
    assert report.rdp_epsilon == pytest.approx(rdp, rel=0.01)


def test_jax_privacy_reference_value():
    eps = pld_epsilon([RoundEvent(0.1, 3.0, 512)], 1e-6)
    assert abs(eps - 3.77) < 1e-3  # the paper reports 3.7697 (|diff| 3.1e-4)


def test_epsilon_properties():
    base = dict(n=1000, expected_batch=20, rounds=20, sigma=1.0, delta=1e-5)
    e0 = compute_epsilon(**base).epsilon
    assert compute_epsilon(**{**base, "sigma": 1.2}).epsilon < e0  # decreases in sigma
    assert compute_epsilon(**{**base, "rounds": 40}).epsilon > e0  # increases in T
    assert compute_epsilon(**{**base, "expected_batch": 40}).epsilon > e0  # increases in q
    assert compute_epsilon(**base).rdp_epsilon >= e0  # RDP is the looser bound


@pytest.mark.parametrize("n,m,rounds,target,paper_sigma", [
    (6988, 128, 50, 8.0, 0.4842404738068581),
    (6961, 128, 100, 8.0, 0.5196564674377442),
])
def test_calibration_meets_target_and_is_smallest(n, m, rounds, target, paper_sigma):
    cal = calibrate(n, m, rounds, target)
    assert cal.epsilon <= target  # never overshoots
    assert cal.epsilon_below > target  # a certified point just below misses the target
    assert cal.sigma_below < cal.sigma <= cal.sigma_below * (1 + 1e-6)
    assert abs(cal.sigma / paper_sigma - 1) < 1e-6  # Table VII, full precision
    assert compute_epsilon(n, m, rounds, 0.999 * cal.sigma).epsilon > target
    assert compute_epsilon(n, m, rounds, cal.sigma).epsilon == pytest.approx(cal.epsilon, abs=0)


def test_calibration_sequential_path_agrees():
    a = calibrate(2000, 40, 10, 2.0, parallel=False)
    b = calibrate(2000, 40, 10, 2.0, parallel=True)
    assert a.sigma == b.sigma and a.epsilon <= 2.0


@pytest.mark.parametrize("kwargs", [
    dict(n=100, expected_batch=200, rounds=10, epsilon=1.0),  # m > n
    dict(n=100, expected_batch=10, rounds=10, epsilon=0.0),  # eps <= 0
    dict(n=100, expected_batch=10, rounds=10, epsilon=1.0, delta=1.0),  # delta >= 1
    dict(n=100, expected_batch=10, rounds=0, epsilon=1.0),
])
def test_bad_calibration_arguments(kwargs):
    with pytest.raises(PrivacyBudgetError):
        calibrate(**kwargs)


def test_an_epsilon_met_only_below_the_sigma_floor_is_refused_before_the_fine_grid(
        eps_evaluations):
    """Issue 33: a huge epsilon's sigma lies where the exact grid needs GiB and minutes; the
    search stops at the floor, having evaluated only coarse grids at or above it."""
    from dpgrpo.privacy.limits import min_sigma

    seen = eps_evaluations
    with pytest.raises(PrivacyBudgetError, match=r"below 0.0484.*smaller epsilon"):
        calibrate(1000, 10, 5, 5000.0, parallel=False)
    assert seen and min(sigma for sigma, _ in seen) >= min_sigma()
    assert {vdi for _, vdi in seen} == {1e-2}


def test_nonpositive_sigma_rejected():
    with pytest.raises(PrivacyBudgetError):
        compute_epsilon(100, 10, 10, 0.0)


def test_ledger_round_trip_recomputes_and_composes():
    n, m, sigma = 1000, 20, 1.1
    delta = default_delta(n)
    ledger = PrivacyLedger()
    for _ in range(15):
        ledger.record(m / n, sigma)
    assert ledger.rounds == 15 and len(ledger.events) == 1  # equal rounds merge
    restored = PrivacyLedger.from_json(json.dumps(json.loads(ledger.to_json())))
    assert restored.events == ledger.events
    assert restored.epsilon(delta) == compute_epsilon(n, m, 15, sigma, delta).epsilon
    both = PrivacyLedger.compose([ledger, restored])
    assert both.rounds == 30
    expected = compute_epsilon(n, m, 30, sigma, delta).epsilon
    assert both.epsilon(delta) == pytest.approx(expected, rel=1e-9)
    assert both.epsilon(delta) > ledger.epsilon(delta)


def test_ledger_nonprivate_round_is_infinite():
    ledger = PrivacyLedger([RoundEvent(0.1, 1.0, 3), RoundEvent(0.1, 0.0, 1)])
    assert math.isinf(ledger.epsilon(1e-5))
    assert pld_epsilon([], 1e-5) == 0.0


def test_conversions():
    eps2, delta2 = replace_one(1.0, 1e-6)
    assert eps2 == 2.0 and delta2 == pytest.approx((1 + math.e) * 1e-6)
    epsk, deltak = group_privacy(0.5, 1e-7, 3)
    assert epsk == 1.5 and deltak == pytest.approx(3 * math.exp(1.0) * 1e-7)
    assert group_privacy(0.5, 1e-7, 1) == (0.5, 1e-7)
    with pytest.raises(PrivacyBudgetError):
        group_privacy(0.5, 1e-7, 0)


def test_round_event_validation():
    with pytest.raises(PrivacyBudgetError):
        RoundEvent(1.5, 1.0)
    with pytest.raises(PrivacyBudgetError):
        RoundEvent(0.5, -1.0)
    with pytest.raises(PrivacyBudgetError):
        RoundEvent(0.5, 1.0, 0)


def test_calibration_survives_a_dead_helper_process(monkeypatch):
    from dpgrpo.privacy import calibration

    def dead(self):
        raise OSError("accounting worker exited")

    monkeypatch.setattr(calibration._ExactWorker, "result", dead)
    original = calibration._coarse_root

    def expensive(s):  # force the parallel path, whatever the machine's speed
        out = original(s)
        s.fine_cost_estimate = 10.0
        return out

    monkeypatch.setattr(calibration, "_coarse_root", expensive)
    cal = calibration.calibrate(2000, 40, 10, 2.0)
    assert cal.epsilon <= 2.0 < cal.epsilon_below
    assert cal.sigma == calibration.calibrate(2000, 40, 10, 2.0, parallel=False).sigma


# --------------------------------------------------------------------------------------------
# Replace-one and group figures of the bare `dpgrpo train` (issue 17)
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bare_run():
    """The ledger and delta of a bare `dpgrpo train`, derived from the code: n from the
    arithmetic task, m and T from embedded_default(), sigma calibrated as build_run does."""
    from dpgrpo.config import embedded_default
    from dpgrpo.tasks import get_task, load_problems

    cfg = embedded_default()
    n = len(load_problems(get_task(cfg.data.task), cfg.data.split, cfg.data.data_dir))
    m, rounds, delta = cfg.privacy.expected_batch, cfg.train.rounds, default_delta(n)
    sigma = calibrate(n, m, rounds, cfg.privacy.epsilon, delta).sigma
    assert (n, m, rounds, delta) == (1000, 2.0, 12, 1e-4) and abs(sigma - 0.2922) < 1e-4
    return [RoundEvent(m / n, sigma, rounds)], delta


def test_bare_run_replace_one_and_group_figures(bare_run):
    events, delta = bare_run
    eps = pld_epsilon(events, delta)
    replace = replace_one_epsilon(events, delta)
    group = {k: group_epsilon(events, delta, k) for k in (1, 2, 3)}
    assert round(eps, 3) == 8.0
    assert round(replace, 3) == 8.012  # the generic conversion says (16.0, 0.298)
    assert round(group[2], 2) == 10.17 and round(group[3], 2) == 12.61  # generic: (16.0, 0.596)
    # k = 1 through the mixture-of-Gaussians PLD is the add-or-remove-one figure itself.
    assert group[1] == pytest.approx(eps, abs=1e-6)
    assert eps < replace < group[2] < group[3]
    assert replace_one(eps, delta)[1] > 0.29 and group_privacy(eps, delta, 2)[1] > 0.59


def test_group_epsilon_beats_proposition_1():
    events = [RoundEvent(0.02, 1.0, 30)]
    eps = pld_epsilon(events, 1e-5)
    for k in (2, 3):
        eps_k, delta_k = group_privacy(eps, 1e-5, k)  # Proposition 1: (k eps, k e^((k-1)eps) delta)
        assert delta_k < 1
        assert group_epsilon(events, delta_k, k) < 0.9 * eps_k


def test_figures_of_degenerate_ledgers():
    assert group_epsilon([], 1e-5, 3) == 0.0 and replace_one_epsilon([], 1e-5) == 0.0
    assert group_epsilon([RoundEvent(0.0, 0.0, 5)], 1e-5, 2) == 0.0  # never sampled: no cost
    noisy_free = [RoundEvent(0.1, 1.0, 2), RoundEvent(0.1, 0.0, 1)]
    assert math.isinf(group_epsilon(noisy_free, 1e-5, 2))
    assert math.isinf(replace_one_epsilon(noisy_free, 1e-5))
    for bad in (0, -1, 1.5):
        with pytest.raises(PrivacyBudgetError):
            group_epsilon([RoundEvent(0.1, 1.0, 2)], 1e-5, bad)
    with pytest.raises(PrivacyBudgetError):
        replace_one_epsilon([RoundEvent(0.1, 1.0, 2)], 1.0)
