"""DIBA's membership classifier, its cross-validated evaluation and the hardness split.

Pure scikit-learn on a feature matrix (one row per candidate prompt, columns
:data:`dpgrpo.audit.features.DIBA_FEATURES`). Following the attack paper (Liu et al., "GRPO
Privacy Is at Risk", Section 5 "Prediction", Section 6 "Evaluation Metrics" and Appendix D):

* the predictor is a stacking classifier whose base estimators are a random forest with 100
  trees and a logistic-regression pipeline (median imputation with missing indicators, then
  column-wise standard scaling), combined by a logistic-regression meta-learner trained on
  cross-validated base predictions;
* it is evaluated by stratified 5-fold cross-validation with a recorded seed: each fold trains
  on four fifths of members and non-members and scores the held-out fifth; AUC, balanced
  accuracy and TPR at 0.1% and 1% FPR are the means over the folds, and the pooled out-of-fold
  scores give the ROC figure;
* beyond the paper, an optional permutation test (:func:`permutation_test`): the same
  evaluation on shuffled labels, whose null distribution calibrates the AUC of a classifier
  fitted on a few dozen candidates (the bootstrap interval alone does not), optionally with
  Besag and Clifford's sequential stopping rule (:mod:`dpgrpo.audit.sequential`);
* the hardness split of Table 3 partitions candidates into All-1 (base and fine-tuned mean
  reward both 1), All-0 (both 0) and Residual (the rest), and fits a dedicated predictor in
  each subset.

The model-facing code that produces the features is in :mod:`dpgrpo.audit.scoring`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from dpgrpo.audit.metrics import (
    DEFAULT_FPRS,
    AttackMetrics,
    attack_metrics,
    mean_metrics,
)
from dpgrpo.audit.sequential import (
    check_rule,
    draw_both_tails,
    draws_made,
    sequential_p_value,
    two_sided_p_value,
)

#: Names of the three hardness subsets (Table 3) and of the whole set.
ALL_ZERO, ALL_ONE, RESIDUAL, UNIFIED = "All-0", "All-1", "Residual", "Unified"


def make_stacking_classifier(*, n_estimators: int = 100, seed: int = 0, inner_folds: int = 5):
    """DIBA's stacking classifier (Appendix D): random forest + scaled logistic regression.

    ``inner_folds`` is the cross-validation used to produce the meta-learner's training
    features (scikit-learn's cross-validated stacking), stratified and seeded with ``seed``.
    """
    from sklearn.ensemble import RandomForestClassifier, StackingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    forest = RandomForestClassifier(n_estimators=n_estimators, random_state=seed, n_jobs=1)
    linear = make_pipeline(
        SimpleImputer(strategy="median", add_indicator=True),
        StandardScaler(),
        LogisticRegression(max_iter=1000),
    )
    return StackingClassifier(
        estimators=[("random_forest", forest), ("logistic", linear)],
        final_estimator=LogisticRegression(max_iter=1000),
        cv=StratifiedKFold(n_splits=inner_folds, shuffle=True, random_state=seed),
        stack_method="predict_proba",
        n_jobs=1,
    )


@dataclass(frozen=True)
class CVResult:
    """A cross-validated attack: per-fold metrics, their mean, and out-of-fold scores.

    ``oof_scores[i]`` is the member probability of candidate i from the fold that held it out.
    """

    folds: list[AttackMetrics]
    mean: AttackMetrics
    oof_scores: np.ndarray
    labels: np.ndarray
    n_folds: int
    seed: int
    n_estimators: int

    @property
    def pooled(self) -> AttackMetrics:
        """Metrics of the pooled out-of-fold scores, with a bootstrap AUC interval (95%)."""
        return attack_metrics(self.labels, self.oof_scores)

    def to_dict(self) -> dict:
        """A JSON-ready dictionary (scores omitted)."""
        return {
            "n_folds": self.n_folds,
            "seed": self.seed,
            "n_estimators": self.n_estimators,
            "mean": self.mean.to_dict(),
            "pooled": self.pooled.to_dict(),
            "folds": [f.to_dict() for f in self.folds],
        }


def _check_xy(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels).astype(int).ravel()
    if x.ndim != 2 or x.shape[0] != y.size:
        raise ValueError(f"features {x.shape} do not match {y.size} labels")
    if not set(np.unique(y)) <= {0, 1}:
        raise ValueError("labels must be 0 (non-member) or 1 (member)")
    return x, y


def cross_validate_attack(features: np.ndarray, labels: np.ndarray, *, n_folds: int = 5,
                          seed: int = 0, n_estimators: int = 100,
                          fprs: tuple[float, ...] = DEFAULT_FPRS) -> CVResult:
    """Stratified k-fold evaluation of the stacking classifier (DIBA Section 6).

    Each class needs at least ``n_folds`` candidates. Returns the mean metrics over the folds,
    as the paper reports them, and the pooled out-of-fold member probabilities.
    """
    from sklearn.model_selection import StratifiedKFold

    x, y = _check_xy(features, labels)
    smallest = int(min(y.sum(), y.size - y.sum()))
    if smallest < n_folds:
        raise ValueError(f"{n_folds}-fold cross-validation needs at least {n_folds} members and "
                         f"{n_folds} non-members; the smaller class has {smallest}")
    splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    oof = np.full(y.size, np.nan)
    folds: list[AttackMetrics] = []
    for train, test in splitter.split(x, y):
        inner = int(min(5, y[train].sum(), (1 - y[train]).sum()))
        if inner < 2:  # the stacking's inner split would leave a fold with one class
            raise ValueError(f"{n_folds}-fold cross-validation leaves a training fold with "
                             f"{inner} candidate(s) of one class; the stacking needs 2")
        clf = make_stacking_classifier(n_estimators=n_estimators, seed=seed, inner_folds=inner)
        clf.fit(x[train], y[train])
        proba = clf.predict_proba(x[test])[:, 1]
        oof[test] = proba
        folds.append(attack_metrics(y[test], proba, predictions=clf.predict(x[test]), fprs=fprs))
    return CVResult(folds, mean_metrics(folds), oof, y, n_folds, seed, n_estimators)


@dataclass(frozen=True)
class PermutationTest:
    """The attack's pooled out-of-fold AUC against the same attack on shuffled labels.

    Each draw permutes the membership labels (class sizes kept) and reruns the whole
    cross-validated evaluation on the same features, so the null distribution holds what the
    bootstrap interval of :func:`dpgrpo.audit.metrics.auc_confidence_interval` leaves out: the
    variance of fitting the classifier on a few dozen candidates and its bias (without signal,
    cross-validated classifiers score below 0.5 on average on small sets). Leakage shows as a
    large AUC, so ``p_value`` is one-sided; an AUC far *below* the null is a signal too
    (leakage that lowers members' scores, or members and non-members that are not exchangeable),
    so ``p_value_lower`` and ``p_value_two_sided`` (both tails, Bonferroni) are reported beside
    it, the draws running until both tails' rules stop. ``null`` holds the draws made, at most
    ``permutations``; with ``stop_after = h`` they stop at the h-th null AUC >= the observed one
    (Besag and Clifford 1991, :mod:`dpgrpo.audit.sequential`): p = h / draws then, else
    ``(1 + #{null >= observed}) / (1 + permutations)``, the fixed test's p (``stop_after``
    None). ``permutations`` None: all of ``null`` (a test recorded before the rule existed).
    """

    observed: float
    null: np.ndarray
    seed: int
    permutations: int | None = None
    stop_after: int | None = None

    @property
    def max_draws(self) -> int:
        """The most shuffles the test would draw (``n``)."""
        return int(self.null.size) if self.permutations is None else self.permutations

    @property
    def draws(self) -> int:
        """The shuffles drawn (``L``)."""
        return draws_made(self.observed, self.null, max_draws=self.max_draws,
                          stop_after=self.stop_after)

    @property
    def stopped_early(self) -> bool:
        """Whether the sequential rule stopped before ``permutations`` draws."""
        return self.draws < self.max_draws

    @property
    def p_value(self) -> float:
        return sequential_p_value(self.observed, self.null, max_draws=self.max_draws,
                                  stop_after=self.stop_after)

    @property
    def p_value_two_sided(self) -> float | None:
        """Both tails' sequential p-values combined (None for a test drawn one-sided)."""
        return two_sided_p_value(self.observed, self.null, max_draws=self.max_draws,
                                 stop_after=self.stop_after)

    @property
    def p_value_lower(self) -> float | None:
        """The lower tail's sequential p-value: an AUC this far below the null (None for a
        test drawn one-sided)."""
        try:
            return sequential_p_value(-self.observed, -self.null, max_draws=self.max_draws,
                                      stop_after=self.stop_after)
        except ValueError:
            return None

    @property
    def null_band(self) -> tuple[float, float]:
        """The central 95% of the null AUCs drawn."""
        low, high = np.quantile(self.null, [0.025, 0.975])
        return float(low), float(high)

    def to_dict(self) -> dict:
        """A JSON-ready dictionary (the null AUCs included). ``permutations`` is the most
        shuffles (n), ``draws`` those made (L)."""
        return {"statistic": "pooled out-of-fold AUC", "observed": self.observed,
                "permutations": self.max_draws, "seed": self.seed,
                "null_mean": float(self.null.mean()), "null_band": list(self.null_band),
                "p_value": self.p_value, "p_value_lower": self.p_value_lower,
                "p_value_two_sided": self.p_value_two_sided,
                "null": [float(v) for v in self.null],
                "draws": self.draws, "drawn_both_tails": int(self.null.size),
                "stop_after": self.stop_after,
                "stopped_early": self.stopped_early,
                "rule": "fixed" if self.stop_after is None else "Besag-Clifford sequential"}


def _shuffled_aucs(x: np.ndarray, y: np.ndarray, seed: int, n_folds: int,
                   n_estimators: int) -> Iterator[float]:
    """The attack's pooled AUC on one label shuffle after another (lazily: one refit each)."""
    rng = np.random.default_rng(seed)
    while True:
        yield cross_validate_attack(x, rng.permutation(y), n_folds=n_folds, seed=seed,
                                    n_estimators=n_estimators).pooled.auc


def permutation_test(features: np.ndarray, labels: np.ndarray, *, permutations: int,
                     seed: int = 0, n_folds: int = 5, n_estimators: int = 100,
                     observed: CVResult | None = None,
                     stop_after: int | None = None) -> PermutationTest:
    """:class:`PermutationTest` of :func:`cross_validate_attack` with at most ``permutations``
    label shuffles (``seed`` seeds the shuffles and, as in the observed run, every CV split).

    ``stop_after`` (h, 1 <= h <= permutations) stops at the h-th shuffle whose AUC reaches the
    observed one (Besag and Clifford's sequential p-value); the shuffles drawn are the fixed
    test's first ones. None: all ``permutations`` (the fixed test). ``observed`` is the
    evaluation on the true labels, reused when given."""
    x, y = _check_xy(features, labels)
    check_rule(permutations, stop_after)
    if observed is None:
        observed = cross_validate_attack(x, y, n_folds=n_folds, seed=seed,
                                         n_estimators=n_estimators)
    auc = observed.pooled.auc
    null = draw_both_tails(auc, _shuffled_aucs(x, y, seed, n_folds, n_estimators),
                           max_draws=permutations, stop_after=stop_after)
    return PermutationTest(auc, null, seed, permutations, stop_after)


def hardness_split(ft_score: Sequence[float] | np.ndarray,
                   base_score: Sequence[float] | np.ndarray) -> np.ndarray:
    """Table 3's subset of each candidate: All-1, All-0 or Residual (array of names)."""
    ft = np.asarray(ft_score, dtype=np.float64)
    base = np.asarray(base_score, dtype=np.float64)
    out = np.full(ft.shape, RESIDUAL, dtype=object)
    out[(ft == 1.0) & (base == 1.0)] = ALL_ONE
    out[(ft == 0.0) & (base == 0.0)] = ALL_ZERO
    return out


@dataclass(frozen=True)
class SubsetResult:
    """One hardness subset: its size by class and, when large enough, its CV result."""

    name: str
    n_members: int
    n_nonmembers: int
    result: CVResult | None
    note: str = ""

    def to_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return {
            "subset": self.name,
            "n_samples": self.n_members + self.n_nonmembers,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            "metrics": None if self.result is None else self.result.mean.to_dict(),
            **({"note": self.note} if self.note else {}),
        }


def evaluate_by_hardness(features: np.ndarray, labels: np.ndarray,
                         subsets: Sequence[str] | np.ndarray, *,
                         n_folds: int = 5, seed: int = 0, n_estimators: int = 100,
                         min_per_class: int = 3,
                         unified: CVResult | None = None) -> list[SubsetResult]:
    """A dedicated predictor per hardness subset, then on the whole set (Table 3).

    A subset is cross-validated with ``min(n_folds, smaller class size)`` folds; a subset with
    fewer than ``min_per_class`` candidates of either class gets no metrics, and says why (3 is
    the least that leaves each training fold 2 of each class for the stacking's inner split).
    ``unified``, when given, is reused as the whole-set result instead of refitting.
    """
    x, y = _check_xy(features, labels)
    names = np.asarray(subsets, dtype=object)
    out: list[SubsetResult] = []
    for name in (ALL_ZERO, ALL_ONE, RESIDUAL, UNIFIED):
        sel = np.ones(y.size, bool) if name == UNIFIED else names == name
        n_mem, n_non = int(y[sel].sum()), int((1 - y[sel]).sum())
        if name == UNIFIED and unified is not None:
            out.append(SubsetResult(name, n_mem, n_non, unified))
            continue
        k = min(n_folds, n_mem, n_non)
        if k < min_per_class:
            note = f"too few candidates of one class for {min_per_class}-fold CV"
            out.append(SubsetResult(name, n_mem, n_non, None, note=note))
            continue
        res = cross_validate_attack(x[sel], y[sel], n_folds=k, seed=seed, n_estimators=n_estimators)
        note = "" if k == n_folds else f"{k}-fold (smaller class has {min(n_mem, n_non)})"
        out.append(SubsetResult(name, n_mem, n_non, res, note=note))
    return out


@dataclass(frozen=True)
class ScoreAttack:
    """A score-only attack (a single feature or a baseline): metrics of the score itself."""

    name: str
    metrics: AttackMetrics | None
    note: str = ""

    def to_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return {"name": self.name, "metrics": None if self.metrics is None
                else self.metrics.to_dict(), **({"note": self.note} if self.note else {})}


def score_attacks(scores: dict[str, np.ndarray], labels: np.ndarray, *,
                  fprs: tuple[float, ...] = DEFAULT_FPRS) -> list[ScoreAttack]:
    """Threshold attacks on single scores (higher: member), fixed orientation, no fitting.

    Candidates whose score is NaN are dropped for that score (the note says how many).
    """
    y = np.asarray(labels).astype(int).ravel()
    out: list[ScoreAttack] = []
    for name, s in scores.items():
        s = np.asarray(s, dtype=np.float64).ravel()
        keep = np.isfinite(s)
        note = "" if keep.all() else f"{int((~keep).sum())} candidates without a score dropped"
        if y[keep].sum() == 0 or y[keep].sum() == keep.sum():
            out.append(ScoreAttack(name, None, note or "one class only"))
            continue
        out.append(ScoreAttack(name, attack_metrics(y[keep], s[keep], fprs=fprs), note))
    return out


@dataclass(frozen=True)
class MIAResult:
    """The full DIBA evaluation: unified CV, hardness split, single features and baselines."""

    unified: CVResult
    hardness: list[SubsetResult]
    features: list[ScoreAttack]
    baselines: list[ScoreAttack] = field(default_factory=list)
    permutation: PermutationTest | None = None

    def to_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return {
            "diba": self.unified.to_dict(),
            "hardness": [h.to_dict() for h in self.hardness],
            "features": [f.to_dict() for f in self.features],
            "baselines": [b.to_dict() for b in self.baselines],
            **({"permutation": self.permutation.to_dict()} if self.permutation else {}),
        }


def evaluate_diba(features: np.ndarray, labels: np.ndarray, feature_names: Sequence[str], *,
                  baselines: dict[str, np.ndarray] | None = None, n_folds: int = 5,
                  seed: int = 0, n_estimators: int = 100, permutations: int = 0,
                  stop_after: int | None = None) -> MIAResult:
    """Run the whole evaluation on a DIBA feature matrix (columns named by ``feature_names``).

    The hardness split needs the ``ft_score`` and ``base_score`` columns. ``permutations`` > 0
    adds the :func:`permutation_test` of the unified attack (``stop_after``: its sequential
    stopping rule; None, the fixed test).
    """
    x, y = _check_xy(features, labels)
    names = list(feature_names)
    if len(names) != x.shape[1]:
        raise ValueError(f"{len(names)} feature names for {x.shape[1]} columns")
    unified = cross_validate_attack(x, y, n_folds=n_folds, seed=seed, n_estimators=n_estimators)
    subsets = hardness_split(x[:, names.index("ft_score")], x[:, names.index("base_score")])
    hardness = evaluate_by_hardness(x, y, subsets, n_folds=n_folds, seed=seed,
                                    n_estimators=n_estimators, unified=unified)
    singles = score_attacks({n: x[:, i] for i, n in enumerate(names)}, y)
    permutation = None if permutations < 1 else permutation_test(
        x, y, permutations=permutations, seed=seed, n_folds=n_folds, n_estimators=n_estimators,
        observed=unified, stop_after=stop_after)
    return MIAResult(unified, hardness, singles, score_attacks(baselines or {}, y), permutation)
