"""Membership-inference metrics: AUC, balanced accuracy, TPR at a fixed FPR.

The metrics follow the attack paper's evaluation (DIBA, Section 6 "Evaluation Metrics"), which in
turn follows Carlini et al. (2022), "Membership inference attacks from first principles": the
area under the ROC curve, balanced accuracy of the thresholded classifier, and the true-positive
rate at a low false-positive rate read off the ROC curve. Labels are 1 for members, 0 for
non-members; a higher score means "more likely a member".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

#: The false-positive rates at which the audit reports a TPR (0.1% and 1%).
DEFAULT_FPRS: tuple[float, ...] = (0.001, 0.01)


def _check(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels).astype(int).ravel()
    s = np.asarray(scores, dtype=float).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ in length")
    if not set(np.unique(y)) <= {0, 1}:
        raise ValueError("labels must be 0 (non-member) or 1 (member)")
    if y.sum() == 0 or y.sum() == y.size:
        raise ValueError("need at least one member and one non-member")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite (impute or drop NaN/inf first)")
    return y, s


def roc_points(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve as ``(fpr, tpr)`` arrays, one point per distinct threshold, from (0, 0).

    Thresholding at each distinct score ``t`` predicts "member" for ``score >= t``; tied scores
    move together, so the curve has a point per distinct value (no intermediate points dropped).
    """
    from sklearn.metrics import roc_curve

    y, s = _check(labels, scores)
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return fpr, tpr


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float) -> float:
    """The largest TPR over ROC points whose FPR is at most ``fpr`` (Carlini et al., 2022).

    With ``n0`` non-members, an FPR below ``1/n0`` admits no false positive at all, so TPR@0.1%
    on fewer than 1,000 non-members is the TPR at zero false positives.
    """
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    f, t = roc_points(labels, scores)
    return float(t[f <= fpr + 1e-12].max())


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties count one half)."""
    from sklearn.metrics import roc_auc_score

    y, s = _check(labels, scores)
    return float(roc_auc_score(y, s))


def auc_confidence_interval(labels: np.ndarray, scores: np.ndarray, *, draws: int = 4000,
                            level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for the AUC, members and non-members resampled separately.

    AUC is the Mann-Whitney statistic ``P(s_member > s_nonmember) + P(tie) / 2``; with the
    pairwise matrix ``W`` a draw with multiplicities ``a`` (members) and ``b`` (non-members) has
    AUC ``a W b / (n1 n0)``, so all draws are two matrix products. ``seed`` is recorded by the
    caller; an interval that excludes 0.5 says the attack beats chance on this evaluation set.
    """
    y, s = _check(labels, scores)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    pos, neg = s[y == 1], s[y == 0]
    w = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])   # (n1, n0)
    rng = np.random.default_rng(seed)
    a = rng.multinomial(pos.size, np.full(pos.size, 1.0 / pos.size), size=draws)  # (D, n1)
    b = rng.multinomial(neg.size, np.full(neg.size, 1.0 / neg.size), size=draws)  # (D, n0)
    values = np.einsum("di,ij,dj->d", a, w, b) / (pos.size * neg.size)
    tail = (1.0 - level) / 2.0
    return float(np.quantile(values, tail)), float(np.quantile(values, 1.0 - tail))


def balanced_accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Mean of the TPR and the TNR of hard 0/1 predictions."""
    y = np.asarray(labels).astype(int).ravel()
    p = np.asarray(predictions).astype(int).ravel()
    tpr = float((p[y == 1] == 1).mean())
    tnr = float((p[y == 0] == 0).mean())
    return 0.5 * (tpr + tnr)


@dataclass(frozen=True)
class AttackMetrics:
    """The metrics of one attack on one evaluation set.

    ``tpr_at_fpr`` maps the FPR written as a string (``"0.001"``) to the TPR at that FPR.
    ``balanced_accuracy`` is ``None`` for score-only attacks that have no decision threshold.
    """

    auc: float
    tpr_at_fpr: dict[str, float]
    n_members: int
    n_nonmembers: int
    balanced_accuracy: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return {
            "auc": self.auc,
            "balanced_accuracy": self.balanced_accuracy,
            "tpr_at_fpr": dict(self.tpr_at_fpr),
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }


def attack_metrics(labels: np.ndarray, scores: np.ndarray, *,
                   predictions: np.ndarray | None = None,
                   fprs: tuple[float, ...] = DEFAULT_FPRS) -> AttackMetrics:
    """AUC, TPR at each FPR in ``fprs`` and, given hard predictions, balanced accuracy."""
    y, s = _check(labels, scores)
    low, high = auc_confidence_interval(y, s)
    return AttackMetrics(
        auc=auc(y, s),
        tpr_at_fpr={str(f): tpr_at_fpr(y, s, f) for f in fprs},
        n_members=int(y.sum()),
        n_nonmembers=int((1 - y).sum()),
        balanced_accuracy=None if predictions is None else balanced_accuracy(y, predictions),
        extra={"auc_ci_low": low, "auc_ci_high": high},
    )


def mean_metrics(folds: list[AttackMetrics]) -> AttackMetrics:
    """The per-fold mean of each metric, as the attack paper reports its 5-fold results."""
    if not folds:
        raise ValueError("no folds to average")
    keys = folds[0].tpr_at_fpr.keys()
    bal = [m.balanced_accuracy for m in folds]
    return AttackMetrics(
        auc=float(np.mean([m.auc for m in folds])),
        tpr_at_fpr={k: float(np.mean([m.tpr_at_fpr[k] for m in folds])) for k in keys},
        n_members=sum(m.n_members for m in folds),
        n_nonmembers=sum(m.n_nonmembers for m in folds),
        balanced_accuracy=(None if any(b is None for b in bal)
                           else float(np.mean(cast(list[float], bal)))),
        extra={"auc_std": float(np.std([m.auc for m in folds]))},
    )
