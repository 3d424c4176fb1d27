"""The f-DP one-run bound (audit/fdp.py) and the rounds' independence check
(audit/independence.py), with real numbers (issue 58)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpgrpo.audit.fdp import fdp_bound, guesses, largest_rejected_mu, p_value, profile
from dpgrpo.audit.independence import round_independence
from dpgrpo.audit.whitebox_stats import llr_scores


def test_profile_of_one_gaussian_round_is_the_gaussian_test():
    # q = 1, T = 1: the MAP decoder's error is Phi(-mu/2), and the error among the most
    # confident half (|L| above its median) is the Gaussian tail's, computed directly
    for mu in (0.5, 2.0):
        prof = profile(mu, 1.0, 1)
        assert prof.error_rate == pytest.approx(stats.norm.cdf(-mu / 2), abs=2e-4)
        # |L| = mu |x - mu/2| under P: its median over M is where half the mass lies above
        x = np.random.default_rng(0).standard_normal(400_000)
        y = np.where(np.arange(x.size) % 2 == 0, x, x + mu)       # half excluded, half in
        ell = mu * y - mu * mu / 2
        top = np.abs(ell) >= np.median(np.abs(ell))
        wrong = (ell >= 0) != (np.arange(x.size) % 2 == 1)
        assert prof.gbar(np.array([0.5]))[0] == pytest.approx(wrong[top].mean(), abs=3e-3)


def _null_audit(rng, m, q, mu, rounds):
    bits = rng.random(m) < 0.5
    coins = (rng.random((rounds, m)) < q) & bits
    return llr_scores(rng.standard_normal((rounds, m)) + coins * mu, q, 1 / mu), bits


def test_p_value_is_uniform_under_the_certified_channel():
    """200 audits of exactly the null channel (q 0.05, T 4, mu 2, 2,000 canaries, 150 kept):
    the p-value is exact, so about 5% fall at or below 0.05 and about half below 0.5."""
    rng, q, mu, t, m, r = np.random.default_rng(7), 0.05, 2.0, 4, 2000, 150
    prof = profile(mu, q, t)
    ps = np.array([p_value(prof, m=m, r=r, u=guesses(*_null_audit(rng, m, q, mu, t), r))
                   for _ in range(200)])
    assert np.mean(ps <= 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)
    assert 0.38 < np.mean(ps <= 0.5) < 0.62
    # a channel twice as strong makes far fewer errors: its nulls are rejected
    strong = [p_value(prof, m=m, r=r, u=guesses(*_null_audit(rng, m, q, 2 * mu, t), r))
              for _ in range(5)]
    assert max(strong) < 1e-6


def test_bound_reaches_near_the_certificate_and_moves_with_the_signal():
    """Operating-point-like channel (q 0.016, T 12, sigma 0.38, 16,000 canaries, r 887): the
    correct channel's rejected mu' is within 15% of the certified one, below it; doubling mu
    (noise std halved) puts it above, with the certified curve rejected."""
    rng, q, sigma, t, m = np.random.default_rng(3), 0.016, 0.3806, 12, 16_000
    scores, bits = _null_audit(rng, m, q, 1 / sigma, t)
    mu, rejected = largest_rejected_mu(mu_cert=1 / sigma, q=q, rounds=t, m=m, r=887,
                                       u=guesses(scores, bits, 887), confidence=0.95)
    assert 0.85 / sigma < mu < 1 / sigma and not rejected
    scores, bits = _null_audit(rng, m, q, 2 / sigma, t)
    b = fdp_bound(scores, bits, q=q, sigma=sigma, rounds=t, delta=1e-6, r=887)
    assert b.certified_rejected and b.flagged and b.mu_rejected > 1.5 / sigma
    assert b.p_certified < 1e-10


def test_independence_check_false_alarms_rarely_and_names_what_flagged():
    rng = np.random.default_rng(5)
    none = np.zeros(600, dtype=bool)
    flags = sum(round_independence(rng.standard_normal((12, 600)), none).flagged
                for _ in range(300))
    assert flags <= 3                                   # alpha 1e-3: expected 0.3 in 300
    reused = np.tile(rng.standard_normal(600), (12, 1))
    ind = round_independence(reused, none)
    assert ind.flagged_by == ("consecutive", "any_pair", "pooled")
    # a key per two rounds: rounds 0 and 2 share noise, consecutive rounds do not
    z = rng.standard_normal((6, 600))
    every_other = np.stack([z[0], z[1], z[0], z[2], z[3], z[4]])
    assert round_independence(every_other, none).flagged_by == ("any_pair",)
    # a tenth of every round's noise shared with the next (correlation 0.1 at n = 5,000)
    w = rng.standard_normal((13, 5000))
    part = math.sqrt(0.9) * w[1:] + math.sqrt(0.1) * w[:-1]
    assert "pooled" in round_independence(part, np.zeros(5000, dtype=bool)).flagged_by
    # included canaries are left out: their projections carry the signal
    inc = np.zeros(600, dtype=bool)
    inc[:300] = True
    sig = rng.standard_normal((12, 600)) + 5.0 * inc
    assert round_independence(sig, inc).canaries == 300


def test_the_study_page_prints_the_fdp_bound_and_explains_an_auc_below_one_half():
    from dpgrpo.reports.study import _auc_side_notes, _whitebox_sentence

    w = {"setup": {"canaries": 16000, "delta": 1e-4}, "certified_epsilon": 8.0,
         "analytic": {"bound_delta": 6.25e-7, "certified_epsilon_at_bound_delta": 13.117,
                      "design_median_bound": 2.99, "statistic_mu": 0.146},
         "whitebox_bound": {"epsilon_lower_bound": 3.138, "confidence": 0.95,
                            "count_ceiling": 3.154},
         "final_bound": {"epsilon_lower_bound": 0.417}, "whitebox_fit": {"mu": 0.142},
         "fdp_bound": {"r": 887, "u": 177, "epsilon_lower_bound": 10.916, "capped": False,
                       "epsilon_at_run_delta": 6.609, "p_certified": 0.31},
         "independence": {"flagged_by": [], "consecutive_max_z": 2.24}, "flagged_by": []}
    text = _whitebox_sentence(w)
    assert "10.916 at delta' against the certificate's 13.117" in text
    assert "6.609 at the run's delta against 8.000" in text and "Verdict: passed" in text
    s = {"audit_dp_auc": 0.297, "audit_dp_auc_ci": [0.172, 0.436], "audit_dp_auc_ceiling": 0.85,
         "audit_leaky_auc": 0.55, "audit_leaky_auc_ci": [0.4, 0.7]}
    note = _auc_side_notes(s, {"private_mia": {"permutation": {"p_value_two_sided": 0.04}}})
    assert "DP-GRPO run the AUC's interval lies wholly below 0.5 (two-sided permutation p = " \
           "0.04)" in note and "flipped, AUC 0.703" in note and "leaky run" not in note
    assert "lies above 0.5" in _auc_side_notes(s | {"audit_dp_auc_ci": [0.6, 0.8]}, {})


def test_an_interval_above_one_half_is_a_leak_only_when_the_permutation_test_rejects():
    """2026-12-07's study: DIBA on DP-GRPO 0.654 [0.510, 0.790] with permutation p = 0.059.
    The bootstrap interval leaves out the classifier's fitting, so the page's verdict follows
    the one-sided permutation test (its stated test for leakage), not the interval."""
    from dpgrpo.reports.study import _auc_side_notes

    s = {"audit_dp_auc": 0.654, "audit_dp_auc_ci": [0.510, 0.790], "audit_dp_auc_ceiling": 0.847}
    weak = _auc_side_notes(s, {"private_mia": {"permutation": {
        "p_value": 0.059, "p_value_two_sided": 0.12}}})
    assert "does not reject at 0.05 (one-sided p = 0.059, two-sided 0.12): no leak is shown" \
        in weak and "separates members" not in weak and "allows at most 0.847" in weak
    strong = _auc_side_notes(s, {"private_mia": {"permutation": {
        "p_value": 0.02, "p_value_two_sided": 0.039}}})
    assert "the attack separates members" in strong and "no leak is shown" not in strong
