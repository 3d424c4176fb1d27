"""Compare evaluated arms: accuracies, paired contrasts and lengths (paper Section VIII).

:func:`compare_arms` computes everything from loaded arms; :func:`run_compare` loads the
inputs, computes, and writes ``report.md``, PNG figures and optionally ``report.json``. The
focal arm ``dp-grpo`` is contrasted with every other arm, the base included (Table II); when
it is absent every arm is contrasted with the base. Every non-base arm is also placed against
the base (Fig. 2). Intervals, tests and MDEs are :mod:`dpgrpo.evaluation.stats` (Sec. VII-E).

Seed pairing: the base is one greedy evaluation and is paired with every seed of the other
arm; two trained arms pair their seeds in seed order, the first ``min(k_A, k_B)`` of each
(as the paper pairs DP-GRPO seeds 1-2 with the two supervised seeds, Table XI).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dpgrpo.config.arms import FOCAL_ARM
from dpgrpo.errors import ConfigError
from dpgrpo.evaluation import stats
from dpgrpo.reports.comparison import ArmSummary, Comparison, ContrastRow, Settings
from dpgrpo.reports.inputs import ArmResults, load_arms, load_eval_file, write_archive
from dpgrpo.reports.tables import render_report

#: the per-problem archive ``run_compare`` writes beside report.json (reports.inputs)
ARCHIVE_NAME = "predictions.json.gz"


def summarize_arm(arm: ArmResults) -> ArmSummary:
    """Accuracy per scorer (pp; mean of seeds and per seed), mean tokens and cap rate."""
    return ArmSummary(
        name=arm.name, seeds=arm.seeds, paths=tuple(str(p) for p in arm.paths),
        accuracy={s: 100 * float(c.mean()) for s, c in arm.correct.items()},
        seed_accuracy={s: tuple(100 * float(x) for x in c.mean(axis=1))
                       for s, c in arm.correct.items()},
        mean_tokens=float(arm.n_tokens.mean()),
        seed_mean_tokens=tuple(float(x) for x in arm.n_tokens.mean(axis=1)),
        cap_rate=100 * float(arm.hit_cap.mean()),
        seed_cap_rate=tuple(100 * float(x) for x in arm.hit_cap.mean(axis=1)))


def _scorers(arms: Sequence[ArmResults]) -> tuple[str, ...]:
    """Scorers in first-seen order, 'strict' first."""
    seen: list[str] = []
    for a in arms:
        seen += [s for s in a.correct if s not in seen]
    return tuple(sorted(seen, key=lambda s: (s != "strict", seen.index(s))))


def compare_arms(base: ArmResults, arms: Sequence[ArmResults],
                 settings: Settings = Settings(), *, fixed: Sequence[str] = ()) -> Comparison:
    """Compute every accuracy and contrast of the report (Sections VII-E, VIII).

    ``fixed``: names of arms that are one fixed model, like the base (e.g. the study's public
    warm start): paired with every seed of the other arm rather than with its first seed, and
    every other arm is also contrasted with each of them (``versus_fixed``)."""
    everything = [base, *arms]
    if len({a.name for a in everything}) != len(everything):
        raise ConfigError("arm names must be distinct")
    scorers = _scorers(everything)
    cache: dict[tuple[str, str, str], stats.Contrast] = {}

    def rows(pairs: Sequence[tuple[ArmResults, ArmResults]]) -> list[ContrastRow]:
        out = []
        for a, b in pairs:
            for s in scorers:
                if s not in a.correct or s not in b.correct:
                    continue
                key = (a.name, b.name, s)
                if key not in cache:
                    x, y = a.correct[s], b.correct[s]                    # (k_a, n), (k_b, n)
                    if not {base.name, *fixed} & {a.name, b.name}:
                        k = min(len(x), len(y))
                        x, y = x[:k], y[:k]
                    cache[key] = stats.contrast(
                        x, y, draws=settings.draws,
                        sign_draws=settings.sign_draws, seed=settings.seed,
                        level=settings.level, alpha=settings.alpha, power=settings.power)
                out.append(ContrastRow(a.name, b.name, s, cache[key]))
        return out

    focal = next((a for a in arms if a.name == FOCAL_ARM), None)
    if focal is not None:
        comparators = [a for a in arms if a is not focal] + [base]
        contrasts = rows([(focal, b) for b in comparators])
    else:
        contrasts = rows([(a, base) for a in arms])
    if settings.holm_family == "report" and contrasts:
        adjusted = stats.adjust_family([c.result for c in contrasts])
        contrasts = [ContrastRow(c.arm, c.comparator, c.scorer, r)
                     for c, r in zip(contrasts, adjusted)]
    starts = [a for a in arms if a.name in fixed]
    return Comparison(
        n_problems=int(base.n_tokens.shape[1]), base=base.name,
        focal=focal.name if focal else None, scorers=scorers,
        arms=tuple(summarize_arm(a) for a in everything), contrasts=tuple(contrasts),
        versus_base=tuple(rows([(a, base) for a in arms])), settings=settings,
        versus_fixed=tuple(rows([(a, f) for f in starts for a in arms if a.name not in fixed])))


def write_outputs(comparison: Comparison, out_dir: Path, *, write_json: bool = False,
                  figures: bool = True) -> list[Path]:
    """Write report.md, the PNG figures and (optionally) report.json; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if figures:
        from dpgrpo.reports.figures import write_figures

        written += write_figures(comparison, out_dir)
    report = out_dir / "report.md"
    report.write_text(render_report(comparison, [p.name for p in written]), encoding="utf-8")
    written.insert(0, report)
    if write_json:
        path = out_dir / "report.json"
        path.write_text(json.dumps(comparison.to_dict(), indent=2) + "\n", encoding="utf-8")
        written.insert(1, path)
    return written


def run_compare(inputs: Sequence[Path], base: Path, out_dir: Path, *,
                labels: Sequence[str] | None = None, settings: Settings = Settings(),
                write_json: bool = False, figures: bool = True,
                fixed: Sequence[Path] = ()) -> tuple[Comparison, list[Path]]:
    """Load the inputs, compare them with the base and write the report (``dpgrpo compare``).
    ``fixed``: inputs that are one fixed model each (paired like the base, see compare_arms)."""
    base_arm, arms = load_arms([Path(p) for p in inputs], Path(base), labels)
    marks = {Path(p).resolve() for p in fixed}
    names = [a.name for a in arms
             if any(q.resolve() == m or m in q.resolve().parents for q in a.paths for m in marks)]
    comparison = compare_arms(base_arm, arms, settings, fixed=names)
    written = write_outputs(comparison, out_dir, write_json=write_json, figures=figures)
    if write_json:                  # every interval recomputable from the report's folder
        ids = load_eval_file(Path(base)).ids
        written.append(write_archive(Path(out_dir) / ARCHIVE_NAME, ids, base_arm, arms, names))
    return comparison, written

