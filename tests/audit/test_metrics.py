"""Membership metrics on a hand-made ROC."""

from __future__ import annotations

import numpy as np
import pytest

from dpgrpo.audit.metrics import (
    attack_metrics,
    auc,
    balanced_accuracy,
    mean_metrics,
    roc_points,
    tpr_at_fpr,
)

# 4 members, 5 non-members. Descending thresholds: m, m, n, n, m, m, n, n, n.
MEMBERS = [0.9, 0.8, 0.4, 0.3]
NONMEMBERS = [0.7, 0.5, 0.2, 0.1, 0.05]
LABELS = np.array([1] * 4 + [0] * 5)
SCORES = np.array(MEMBERS + NONMEMBERS)


def test_roc_points_by_hand():
    fpr, tpr = roc_points(LABELS, SCORES)
    pts = set(zip(np.round(fpr, 6), np.round(tpr, 6)))
    for p in [(0.0, 0.0), (0.0, 0.5), (0.2, 0.5), (0.4, 0.5), (0.4, 1.0), (1.0, 1.0)]:
        assert p in pts


def test_tpr_at_fpr_by_hand():
    assert tpr_at_fpr(LABELS, SCORES, 0.001) == 0.5     # zero false positives allowed
    assert tpr_at_fpr(LABELS, SCORES, 0.2) == 0.5
    assert tpr_at_fpr(LABELS, SCORES, 0.39) == 0.5
    assert tpr_at_fpr(LABELS, SCORES, 0.4) == 1.0
    assert tpr_at_fpr(LABELS, -SCORES, 0.2) == 0.0      # reversed scores: FP come first


def test_auc_counts_pairs():
    # member-above-non-member pairs: 5 + 5 + 3 + 3 = 16 of 20
    assert auc(LABELS, SCORES) == pytest.approx(0.8)
    assert auc(LABELS, -SCORES) == pytest.approx(0.2)
    assert auc([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.5)


def test_balanced_accuracy():
    # TPR 3/4, TNR 2/5
    preds = [1, 1, 1, 0, 1, 1, 1, 0, 0]
    assert balanced_accuracy(LABELS, preds) == pytest.approx(0.5 * (0.75 + 0.4))


def test_attack_metrics_and_mean():
    m = attack_metrics(LABELS, SCORES, predictions=(SCORES > 0.45).astype(int))
    assert m.auc == pytest.approx(0.8)
    assert m.tpr_at_fpr == {"0.001": 0.5, "0.01": 0.5}
    assert (m.n_members, m.n_nonmembers) == (4, 5)
    assert m.balanced_accuracy == pytest.approx(0.5 * (0.5 + 0.6))
    avg = mean_metrics([m, attack_metrics(LABELS, -SCORES, predictions=np.zeros(9))])
    assert avg.auc == pytest.approx(0.5)
    assert avg.tpr_at_fpr["0.001"] == pytest.approx(0.25)
    assert avg.balanced_accuracy == pytest.approx(0.5 * (0.55 + 0.5))


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        auc([1, 1], [0.1, 0.2])
    with pytest.raises(ValueError):
        auc([1, 0], [0.1, float("nan")])


def test_auc_interval_matches_a_brute_force_bootstrap_and_separates_signal_from_chance():
    from sklearn.metrics import roc_auc_score

    from dpgrpo.audit.metrics import auc_confidence_interval

    rng = np.random.default_rng(3)
    y = np.r_[np.ones(30), np.zeros(40)].astype(int)
    s = np.round(rng.normal(size=70) + 1.0 * y, 1)             # ties included
    low, high = auc_confidence_interval(y, s, draws=3000, seed=7)
    # the same resampling scheme, done draw by draw with scikit-learn
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    brute = []
    for _ in range(1500):
        idx = np.r_[rng.choice(pos, pos.size), rng.choice(neg, neg.size)]
        brute.append(roc_auc_score(y[idx], s[idx]))
    assert abs(low - np.quantile(brute, 0.025)) < 0.02
    assert abs(high - np.quantile(brute, 0.975)) < 0.02
    assert low < roc_auc_score(y, s) < high and low > 0.5        # a real signal
    null_low, null_high = auc_confidence_interval(y, rng.normal(size=70), seed=7)
    assert null_low < 0.5 < null_high                              # chance
