"""Write audit results: JSON summary, markdown report, log-scale ROC figure, per-candidate table.

Outputs of ``dpgrpo audit mia``: ``summary.json``, ``report.md``, ``roc.png`` and
``candidates.jsonl``. Outputs of ``dpgrpo audit canary``: ``summary.json``, ``report.md`` and
``canaries.jsonl``; the last holds the secret inclusion bits, so no output folder may lie inside
a ``release`` folder (:class:`dpgrpo.errors.ReleaseError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dpgrpo.audit.features import DIBA_FEATURES
from dpgrpo.audit.metrics import AttackMetrics, roc_points
from dpgrpo.audit.pipeline import CanaryOutcome, MIAOutcome
from dpgrpo.errors import ReleaseError


def check_out_dir(out: str | Path) -> Path:
    """``out`` as a Path, or :class:`ReleaseError` if it lies inside a ``release`` folder."""
    out = Path(out)
    if "release" in out.resolve().parts:
        raise ReleaseError(f"refusing to write audit outputs into {out}: audit tables hold "
                           "membership labels or canary inclusion bits, which a release must "
                           "not contain")
    return out


def _out_dir(out: str | Path) -> Path:
    out = check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _metric_row(name: str, m: AttackMetrics | None, n: str = "", note: str = "") -> str:
    if m is None:
        return f"| {name} | {n} | n/a | n/a | n/a | n/a | {note} |"
    return (f"| {name} | {n} | {_fmt(m.auc)} | {_fmt(m.balanced_accuracy)} | "
            f"{_fmt(m.tpr_at_fpr.get('0.001'))} | {_fmt(m.tpr_at_fpr.get('0.01'))} | {note} |")


_HEADER = ("| attack | n | AUC | bal. acc. | TPR@0.1%FPR | TPR@1%FPR | note |\n"
           "|---|---|---|---|---|---|---|")


def roc_figure(path: str | Path, curves: Mapping[str, tuple[np.ndarray, np.ndarray]],
               title: str = "") -> Path:
    """Log-log ROC curves (Carlini et al., 2022; DIBA Figure 3) of ``name -> (labels, scores)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    floor = 1e-4
    for name, (labels, scores) in curves.items():
        fpr, tpr = roc_points(labels, scores)
        ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), label=name, lw=1.2)
    ax.plot([floor, 1], [floor, 1], ls="--", c="grey", lw=0.8, label="chance")
    ax.set(xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1.05),
           xlabel="false-positive rate", ylabel="true-positive rate", title=title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return Path(path)


def mia_summary(o: MIAOutcome) -> dict:
    """The JSON summary of a DIBA audit."""
    return {
        "attack": "DIBA (Liu et al., GRPO Privacy Is at Risk)",
        "run_dir": str(o.run.run_dir),
        "model": o.run.model_name,
        "task": o.run.task_name,
        "certified_epsilon": o.run.epsilon,
        "certified_delta": o.run.delta,
        "certified_auc_ceiling": o.run.auc_ceiling,
        "n_members": int(o.labels.sum()),
        "n_nonmembers": int((1 - o.labels).sum()),
        "sampling": {"n_samples": o.settings.n_samples, "temperature": o.settings.temperature,
                     "max_new_tokens": o.settings.max_new_tokens, "top_p": o.settings.top_p,
                     "repetition_penalty": o.settings.repetition_penalty},
        "seed": o.seed,
        "features": list(DIBA_FEATURES),
        **o.result.to_dict(),
    }


def _ceiling(value: float | None) -> str:
    if value is None:
        return "no ledger in the certificate, so no AUC ceiling."
    return (f"the certificate allows a membership AUC of at most {value:.3f} "
            "(`dpgrpo.privacy.tradeoff`: any attack on one record, members drawn at random).")


def mia_markdown(o: MIAOutcome) -> str:
    """The markdown report of a DIBA audit."""
    r, s = o.result, mia_summary(o)
    lines = [
        "# Membership-inference audit (DIBA)", "",
        f"Run `{o.run.run_dir}`; model `{o.run.model_name}`, task `{o.run.task_name}`; "
        f"certified epsilon {_fmt(o.run.epsilon, 2)} at delta {o.run.delta}; "
        f"{_ceiling(o.run.auc_ceiling)}", "",
        f"{s['n_members']} members, {s['n_nonmembers']} non-members; {o.settings.n_samples} "
        f"samples per prompt and model at temperature {o.settings.temperature}; stacking "
        f"classifier ({r.unified.n_estimators} trees + logistic regression), stratified "
        f"{r.unified.n_folds}-fold CV, seed {o.seed}. Metrics are means over folds; with fewer "
        "than 1,000 non-members per fold, TPR@0.1%FPR is the TPR at zero false positives.", "",
        "## DIBA and its features", "", _HEADER,
        _metric_row("DIBA (stacking)", r.unified.mean, str(o.labels.size)),
    ]
    lines += [_metric_row(f.name, f.metrics, note=f.note) for f in r.features]
    if r.permutation is not None:
        lines += ["", permutation_sentence(r.permutation.to_dict())]
    lines += ["", "## Hardness split (Table 3)", "", _HEADER]
    lines += [_metric_row(h.name, None if h.result is None else h.result.mean,
                          str(h.n_members + h.n_nonmembers), h.note) for h in r.hardness]
    if r.baselines:
        lines += ["", "## Baselines on the gold target (higher score = member)", "", _HEADER]
        lines += [_metric_row(b.name, b.metrics, note=b.note) for b in r.baselines]
    lines += ["", "ROC (log scale, pooled out-of-fold scores): `roc.png`.", ""]
    return "\n".join(lines)


def permutation_sentence(test: Mapping) -> str:
    """One sentence on a permutation test's dictionary (:class:`dpgrpo.audit.mia.PermutationTest`;
    one saved before the sequential rule existed reads as the fixed test it was)."""
    low, high = test["null_band"]
    return (f"Permutation test ({_shuffles(test)}, the whole CV refitted on each): pooled "
            f"out-of-fold AUC {test['observed']:.3f} against a null with mean "
            f"{test['null_mean']:.3f} and central 95% [{low:.3f}, {high:.3f}]; one-sided p = "
            f"{test['p_value']:.3g} (small p: the attack sees membership)"
            + (f"; two-sided p = {test['p_value_two_sided']:.3g} (an AUC far below the null is "
               "a signal too: leakage that lowers members' scores, or a member/non-member "
               "split that is not exchangeable)" if test.get("p_value_two_sided") is not None
               else "") + ".")


def _shuffles(test: Mapping) -> str:
    """How many label shuffles were drawn, and by which rule."""
    n, h = test["permutations"], test.get("stop_after")
    if h is None:
        return f"{n} label shuffles"
    rule = (f"Besag and Clifford's sequential rule (1991): stop once {h} null AUCs are >= "
            f"the observed one, then p = {h} / shuffles drawn, else p = (1 + #null >= "
            f"observed) / (1 + {n})")
    drawn = test.get("draws", n)
    if drawn < n:
        return f"{drawn} label shuffles of at most {n}, stopped by {rule}"
    return f"{n} label shuffles, all drawn under {rule}"


def write_mia_report(out: str | Path, o: MIAOutcome) -> dict[str, Path]:
    """Write ``summary.json``, ``report.md``, ``roc.png`` and ``candidates.jsonl`` into ``out``."""
    out = _out_dir(out)
    paths = {name: out / name for name in ("summary.json", "report.md", "roc.png",
                                           "candidates.jsonl")}
    paths["summary.json"].write_text(json.dumps(mia_summary(o), indent=1) + "\n")
    paths["report.md"].write_text(mia_markdown(o))
    curves = {"DIBA": (o.labels, o.result.unified.oof_scores)}
    for name in ("score_gain", "k3_divergence", "likelihood_ratio"):
        col = o.features[:, DIBA_FEATURES.index(name)]
        if np.isfinite(col).all():
            curves[name] = (o.labels, col)
    roc_figure(paths["roc.png"], curves, title="DIBA, log-scale ROC")
    with paths["candidates.jsonl"].open("w") as f:
        for i, cid in enumerate(o.ids):
            row = {"id": cid, "member": int(o.labels[i]), "subset": str(o.subsets[i]),
                   "diba_score": _json_float(o.result.unified.oof_scores[i]),
                   "features": {n: _json_float(o.features[i, j])
                                for j, n in enumerate(DIBA_FEATURES)},
                   "baselines": {k: _json_float(v[i]) for k, v in o.baselines.items()}}
            f.write(json.dumps(row) + "\n")
    return paths


def canary_summary(o: CanaryOutcome) -> dict:
    """The JSON summary of a canary audit (aggregate counts only, no per-canary bits)."""
    return {
        "audit": "one-run (Steinke, Nasr and Jagielski, 2023)",
        "run_dir": str(o.run.run_dir),
        "model": o.run.model_name,
        "task": o.run.task_name,
        "certified_epsilon": o.run.epsilon,
        "certified_delta": o.run.delta,
        "empirical_epsilon_lower_bound": o.audit.epsilon_lower_bound,
        "signal": o.signal,
        "sampling": {"n_samples": o.settings.n_samples, "temperature": o.settings.temperature,
                     "max_new_tokens": o.settings.max_new_tokens, "top_p": o.settings.top_p,
                     "repetition_penalty": o.settings.repetition_penalty},
        "seed": o.seed,
        **o.audit.to_dict(),
        "n_included": int(o.included.sum()),
    }


def canary_markdown(o: CanaryOutcome) -> str:
    """The markdown report of a canary audit."""
    a = o.audit
    return "\n".join([
        "# One-run canary audit", "",
        f"Run `{o.run.run_dir}`; model `{o.run.model_name}`, task `{o.run.task_name}`.", "",
        "| quantity | value |", "|---|---|",
        f"| certified epsilon (accountant, upper bound) | {_fmt(o.run.epsilon, 3)} |",
        f"| empirical epsilon lower bound ({a.confidence:.0%} confidence) | "
        f"{a.epsilon_lower_bound:.3f} |",
        f"| delta | {a.delta:.3g} |",
        f"| canaries m (included) | {a.m} ({int(o.included.sum())}) |",
        f"| guesses in / out (k+ / k-) | {a.k_plus} / {a.k_minus} |",
        f"| correct guesses v of r | {a.v} of {a.r} |",
        f"| signal | {o.signal} |", "",
        "The lower bound is Steinke, Nasr and Jagielski (2023), Theorem 3.3 with the p-value of "
        "their Appendix D: the largest epsilon at which (epsilon, delta)-DP is rejected at the "
        "stated confidence. It measures the leakage this attack demonstrates, not the "
        "mechanism's true epsilon; a lower bound above the certified epsilon would mean a "
        "bug in the mechanism or its accounting (or a failure of the 1 - confidence event).",
        "",
    ])


def write_canary_report(out: str | Path, o: CanaryOutcome) -> dict[str, Path]:
    """Write ``summary.json``, ``report.md`` and ``canaries.jsonl`` (secret bits) into ``out``."""
    out = _out_dir(out)
    paths = {name: out / name for name in ("summary.json", "report.md", "canaries.jsonl")}
    paths["summary.json"].write_text(json.dumps(canary_summary(o), indent=1) + "\n")
    paths["report.md"].write_text(canary_markdown(o))
    with paths["canaries.jsonl"].open("w") as f:
        for i, cid in enumerate(o.ids):
            row = {"id": cid, "included": bool(o.included[i]),
                   "score": _json_float(o.scores[i]),
                   "features": {n: _json_float(o.features[i, j])
                                for j, n in enumerate(DIBA_FEATURES)}}
            f.write(json.dumps(row) + "\n")
    return paths
