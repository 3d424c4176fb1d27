"""DIBA's stacking classifier, cross-validation and the Table 3 hardness split."""

from __future__ import annotations

import numpy as np
import pytest

from dpgrpo.audit.features import DIBA_FEATURES
from dpgrpo.audit.mia import (
    cross_validate_attack,
    evaluate_diba,
    hardness_split,
    make_stacking_classifier,
    permutation_test,
)


def _synthetic(n_per_class: int, shift: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.array([1] * n_per_class + [0] * n_per_class)
    x = rng.normal(size=(2 * n_per_class, len(DIBA_FEATURES)))
    x[:, 3:] += shift * y[:, None]                      # logit-side columns carry the signal
    x[:, 0] = rng.integers(0, 3, 2 * n_per_class) / 2   # ft_score, base_score in {0, .5, 1}
    x[:, 1] = rng.integers(0, 3, 2 * n_per_class) / 2
    return x, y


def test_classifier_is_the_papers_stack():
    clf = make_stacking_classifier(seed=7)
    forest, linear = (est for _, est in clf.estimators)
    assert forest.n_estimators == 100 and forest.random_state == 7
    imputer = linear.steps[0][1]
    assert imputer.strategy == "median" and imputer.add_indicator
    assert type(linear.steps[1][1]).__name__ == "StandardScaler"
    assert type(clf.final_estimator).__name__ == "LogisticRegression"


def test_separable_data_auc_near_one():
    x, y = _synthetic(30, shift=6.0, seed=0)
    res = cross_validate_attack(x, y, n_folds=5, seed=0, n_estimators=10)
    assert res.mean.auc > 0.98
    assert res.mean.balanced_accuracy > 0.9
    assert res.mean.tpr_at_fpr["0.001"] > 0.8
    assert len(res.folds) == 5 and not np.isnan(res.oof_scores).any()
    assert (res.mean.n_members, res.mean.n_nonmembers) == (30, 30)


def test_random_data_auc_near_half():
    x, y = _synthetic(40, shift=0.0, seed=1)
    res = cross_validate_attack(x, y, n_folds=5, seed=0, n_estimators=10)
    assert 0.3 < res.mean.auc < 0.7
    assert 0.3 < res.mean.balanced_accuracy < 0.7


def test_seed_makes_it_reproducible_and_nan_is_imputed():
    x, y = _synthetic(20, shift=1.0, seed=2)
    x[::7, 4] = np.nan
    a = cross_validate_attack(x, y, n_folds=4, seed=3, n_estimators=5)
    b = cross_validate_attack(x, y, n_folds=4, seed=3, n_estimators=5)
    assert np.array_equal(a.oof_scores, b.oof_scores)
    with pytest.raises(ValueError, match="at least 5 members"):
        cross_validate_attack(x[:24], y[:24], n_folds=5)


def test_hardness_split():
    names = hardness_split([1.0, 0.0, 0.5, 1.0, 0.0], [1.0, 0.0, 0.5, 0.0, 1.0])
    assert names.tolist() == ["All-1", "All-0", "Residual", "Residual", "Residual"]


def test_evaluate_diba_reports_every_subset():
    x, y = _synthetic(20, shift=4.0, seed=4)
    x[:6, 0] = x[:6, 1] = 1.0                           # 6 members in All-1
    x[20:23, 0] = x[20:23, 1] = 1.0                     # 3 non-members in All-1
    x[6:8, 0] = x[6:8, 1] = 0.0                         # All-0: 2 members, no non-member
    x[23:, 0] = np.where(x[23:, 0] == x[23:, 1], 0.5, x[23:, 0])
    x[8:20, 0] = np.where(x[8:20, 0] == x[8:20, 1], 0.5, x[8:20, 0])
    base = {"loss": y + np.linspace(0, 0.5, 40), "zlib": -y.astype(float)}
    res = evaluate_diba(x, y, DIBA_FEATURES, baselines=base, n_folds=5, seed=0, n_estimators=5)
    subsets = {h.name: h for h in res.hardness}
    assert set(subsets) == {"All-0", "All-1", "Residual", "Unified"}
    assert (subsets["All-1"].n_members, subsets["All-1"].n_nonmembers) == (6, 3)
    assert subsets["All-1"].result.n_folds == 3
    assert subsets["All-0"].result is None and "too few" in subsets["All-0"].note
    assert subsets["Unified"].result is res.unified
    assert sum(h.n_members + h.n_nonmembers for h in res.hardness[:3]) == 40
    scores = {b.name: b.metrics for b in res.baselines}
    assert scores["loss"].auc == 1.0 and scores["zlib"].auc == 0.0
    assert {f.name for f in res.features} == set(DIBA_FEATURES)
    d = res.to_dict()
    assert d["diba"]["n_folds"] == 5 and len(d["hardness"]) == 4


def test_a_subset_with_two_of_one_class_gets_a_note_not_a_crash():
    """Two non-members in a subset would be 2-fold CV with one non-member per training fold: the
    stacking's inner split then leaves a fold with one class (scikit-learn raised mid-audit,
    after the sampling). Such a subset is reported as too small; direct CV says why it can't."""
    x, y = _synthetic(20, shift=4.0, seed=5)
    x[:, 0], x[:, 1] = 0.5, 0.0                          # everyone Residual ...
    x[:12, 0] = x[:12, 1] = 1.0                         # ... but 12 members in All-1
    x[20:22, 0] = x[20:22, 1] = 1.0                     # and 2 non-members
    res = evaluate_diba(x, y, DIBA_FEATURES, n_folds=5, seed=0, n_estimators=5)
    subsets = {h.name: h for h in res.hardness}
    assert (subsets["All-1"].n_members, subsets["All-1"].n_nonmembers) == (12, 2)
    assert subsets["All-1"].result is None and "too few" in subsets["All-1"].note
    assert subsets["Residual"].result.n_folds == 5
    sel = np.r_[0:12, 20:22]
    with pytest.raises(ValueError, match="training fold with 1 candidate"):
        cross_validate_attack(x[sel], y[sel], n_folds=2, n_estimators=5)


def test_permutation_test_finds_signal_and_calibrates_noise():
    """Leakage: the observed AUC tops every shuffle (p = 1 / (1 + draws)). No signal: the
    shuffles' AUCs sit around the observed one, and their mean is what the fitted attack
    scores by chance, not 0.5."""
    x, y = _synthetic(16, shift=3.0, seed=0)
    test = permutation_test(x, y, permutations=19, seed=0, n_folds=4, n_estimators=10)
    observed = cross_validate_attack(x, y, n_folds=4, seed=0, n_estimators=10).pooled.auc
    assert test.observed == observed > 0.9
    assert test.p_value == pytest.approx(1 / 20) and test.observed > test.null_band[1]
    assert test.null.shape == (19,) and 0.2 < test.null.mean() < 0.7
    d = test.to_dict()
    assert (d["permutations"], d["p_value"], len(d["null"])) == (19, test.p_value, 19)

    x, y = _synthetic(16, shift=0.0, seed=4)
    noise = permutation_test(x, y, permutations=19, seed=0, n_folds=4, n_estimators=10)
    assert noise.p_value > 0.1
    assert noise.null.min() <= noise.observed <= noise.null.max()


def test_evaluate_diba_adds_the_permutation_test_on_request():
    x, y = _synthetic(12, shift=3.0, seed=5)
    plain = evaluate_diba(x, y, DIBA_FEATURES, n_folds=3, n_estimators=5)
    assert plain.permutation is None and "permutation" not in plain.to_dict()
    tested = evaluate_diba(x, y, DIBA_FEATURES, n_folds=3, n_estimators=5, permutations=4)
    assert tested.permutation.observed == plain.unified.pooled.auc
    assert tested.to_dict()["permutation"]["permutations"] == 4


def _fixed_test_before_the_rule(x, y, n, seed, n_folds, n_estimators, observed):
    """The permutation test as written before Besag and Clifford's rule, for comparison."""
    rng = np.random.default_rng(seed)
    null = np.array([cross_validate_attack(x, rng.permutation(y), n_folds=n_folds, seed=seed,
                                           n_estimators=n_estimators).pooled.auc
                     for _ in range(n)])
    return null, float((1 + np.sum(null >= observed)) / (1 + n))


def test_the_sequential_test_draws_the_fixed_tests_first_shuffles():
    """The real stacking attack on 20 candidates without signal: stop_after=None gives the
    numbers of the test before the rule existed; stop_after=2 stops early, on exactly the first
    draws of the fixed test, with p = 2 / draws."""
    from dpgrpo.audit.sequential import sequential_p_value

    x, y = _synthetic(10, shift=0.0, seed=6)
    cv = cross_validate_attack(x, y, n_folds=3, seed=0, n_estimators=5)
    observed = cv.pooled.auc
    null, p = _fixed_test_before_the_rule(x, y, 6, 0, 3, 5, observed)
    fixed = permutation_test(x, y, permutations=6, seed=0, n_folds=3, n_estimators=5,
                             observed=cv, stop_after=None)
    assert (fixed.observed, fixed.p_value) == (observed, p) and np.array_equal(fixed.null, null)
    assert fixed.null_band == tuple(np.quantile(null, [0.025, 0.975]))
    d = fixed.to_dict()
    assert (d["permutations"], d["draws"], d["stop_after"], d["stopped_early"]) == \
        (6, 6, None, False)

    stopped = permutation_test(x, y, permutations=6, seed=0, n_folds=3, n_estimators=5,
                               observed=cv, stop_after=2)
    # both tails' rules run (two-sided p): the draws go on until the lower tail stops too, and
    # the upper tail's p reads only its own first `draws`
    drawn, upper = stopped.null.size, stopped.draws
    assert upper < 6 and stopped.stopped_early and upper <= drawn
    assert np.array_equal(stopped.null, null[:drawn])
    assert min(np.sum(stopped.null >= observed), np.sum(stopped.null <= observed)) >= 2 or \
        drawn == 6
    assert stopped.p_value == 2 / upper == sequential_p_value(observed, null, max_draws=6,
                                                              stop_after=2)
    d = stopped.to_dict()
    assert (d["permutations"], d["draws"], d["stop_after"], d["p_value"], len(d["null"])) == \
        (6, upper, 2, 2 / upper, drawn)
    assert d["p_value_two_sided"] == min(1.0, 2 * min(d["p_value"], d["p_value_lower"]))
    for h in (0, 7):
        with pytest.raises(ValueError, match="stop_after"):
            permutation_test(x, y, permutations=6, observed=cv, stop_after=h)


def test_a_saved_test_without_the_rule_reads_as_the_fixed_test():
    """A PermutationTest recorded before the rule (no permutations, no stop_after) and the
    report sentence of its saved dictionary."""
    from dpgrpo.audit.mia import PermutationTest
    from dpgrpo.audit.report import permutation_sentence

    old = PermutationTest(0.6, np.array([0.5, 0.7, 0.4, 0.3]), 0)
    assert (old.max_draws, old.draws, old.stopped_early, old.p_value) == (4, 4, False, 2 / 5)
    saved = {k: v for k, v in old.to_dict().items()
             if k not in ("draws", "stop_after", "stopped_early", "rule")}
    assert permutation_sentence(saved).startswith("Permutation test (4 label shuffles, the")
    seq = PermutationTest(0.6, np.array([0.7, 0.4, 0.8]), 0, permutations=50, stop_after=2)
    sentence = permutation_sentence(seq.to_dict())
    assert seq.p_value == 2 / 3 and "3 label shuffles of at most 50" in sentence
    assert "Besag and Clifford" in sentence and "p = 0.667" in sentence


def test_evaluate_diba_passes_the_stopping_rule_on():
    x, y = _synthetic(12, shift=3.0, seed=5)
    tested = evaluate_diba(x, y, DIBA_FEATURES, n_folds=3, n_estimators=5, permutations=2,
                           stop_after=1)
    d = tested.to_dict()["permutation"]
    assert (d["permutations"], d["stop_after"], d["rule"]) == (2, 1, "Besag-Clifford sequential")
