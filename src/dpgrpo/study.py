"""The CPU-scale study: does training learn, and does the audit see leakage? One command.

``dpgrpo study configs/cpu-study.toml --out runs/cpu-study`` runs, on the embedded arithmetic
task and SmolLM2-135M:

1. the protocol (:mod:`dpgrpo.protocol`): the public base, non-private GRPO, DP-GRPO and the
   zero-advantage control at the same (n, q, sigma, T, C), each evaluated greedily on the eval
   split, with the comparison report (paired problem-cluster bootstrap, exact McNemar with
   Holm, MDE) and its figures;
2. a deliberately leaky non-private run on ``members`` training problems seen many times, and
   the DIBA audit (with the classic baselines) of those members against as many held-out
   problems of the same split;
3. with ``dp_leaky = true``, the same audit of the leaky recipe made private: its arm's
   private twin (:func:`dpgrpo.arm_table.private_twin`) at the study's epsilon, sigma
   calibrated, all else equal;
4. the same audit of a DP-GRPO run on the same members at the study's epsilon, whose slot
   universe also holds canaries: their one-run epsilon lower bound is printed beside the
   certified epsilon;
5. optionally (``--sweep``) DP-GRPO at larger epsilons, each contrasted with the control.

Every step is resumable (a rerun into the same folder skips finished work) and timed (wall
seconds and peak RSS). The results page ``cpu-study.md`` and ``cpu-study.json`` are written to
``--results`` (default ``docs/results``); the figures are copied beside them.

The ``[study]`` table of the config (stripped before the run config is built) sets::

    [study]
    members = 32                        # audit members: train[0:32]; non-members: train[32:64]
    audit_samples = 8                   # DIBA responses per prompt and model
    audit_temperature = 0.5
    sweep = [32.0, 128.0]               # epsilons of --sweep
    dp_leaky = true                     # also audit the leaky recipe under DP (step 3)
    [study.leaky]                       # overrides of the leaky non-private run
    "train.steps" = 16
    [study.private_audit]               # overrides of the audited DP-GRPO run
    "audit.canaries" = 32
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Callable, Mapping

from dpgrpo.config import RunConfig, apply_overrides, config_from_dict, read_toml
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.runtime import PeakRSS

Say = Callable[[str], None]
STUDY_JSON, STUDY_MD = "cpu-study.json", "cpu-study.md"


@dataclass(frozen=True)
class StudySettings:
    """What the audit part of the study trains and attacks (public choices, fixed up front)."""

    members: int = 32
    audit_samples: int = 8
    audit_temperature: float = 0.5
    audit_max_new_tokens: int | None = None
    audit_folds: int = 5
    audit_seed: int = 0
    sweep: tuple[float, ...] = (32.0, 128.0)
    leaky: Mapping[str, Any] = field(default_factory=dict)
    dp_leaky: bool = False
    private_audit: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.members < self.audit_folds:
            raise ConfigError(f"study.members must be >= study.audit_folds ({self.audit_folds})")
        if any(not e > 0 for e in self.sweep):
            raise ConfigError(f"study.sweep epsilons must be > 0, got {list(self.sweep)}")

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "StudySettings":
        known = set(cls.__dataclass_fields__)
        if unknown := sorted(set(table) - known):
            raise ConfigError(f"unknown study key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values = dict(table)
        if "sweep" in values:
            values["sweep"] = tuple(float(e) for e in values["sweep"])
        return cls(**values)


class Steps:
    """Wall time and peak RSS of each named step of the study.

    With ``record`` (a JSON file), each finished step is written there at once, and a step
    that a resumed study skips keeps the time and memory of the run that did its work (for each
    step name, the row with the most seconds), so an interrupted study still reports them.
    """

    def __init__(self, say: Say, record: Path | None = None) -> None:
        self.say, self.record = say, record
        self._rows: list[dict[str, Any]] = []
        if record is not None and record.exists():
            self._rows = list(json.loads(record.read_text()))
        self.started = time.perf_counter()

    @property
    def rows(self) -> list[dict[str, Any]]:
        best: dict[str, dict[str, Any]] = {}
        for row in self._rows:
            if row["step"] not in best or row["seconds"] > best[row["step"]]["seconds"]:
                best[row["step"]] = row
        return list(best.values())

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(f"{name} ...")
        t0 = time.perf_counter()
        with PeakRSS(interval=0.05) as mem:
            out = fn()
        row = {"step": name, "seconds": round(time.perf_counter() - t0, 1),
               "peak_rss_bytes": mem.peak}
        self._rows.append(row)
        if self.record is not None:
            from dpgrpo.checkpoint import atomic_write_json

            self.record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.record, self.rows)
        self.say(f"{name}: {row['seconds']:.0f} s")
        return out

    @property
    def wall(self) -> float:
        """Seconds of study work: the sum of the steps' rows (resumed steps included)."""
        return sum(row["seconds"] for row in self.rows)


def _overrides(table: Mapping[str, Any]) -> list[str]:
    return [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
            for k, v in table.items()]


def _train_once(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Train (or resume, or skip when complete) one run; its certificate."""
    from dpgrpo.protocol import check_run_dir, release_complete
    from dpgrpo.trainer import train

    check_run_dir(config, run_dir)   # a folder holding another run is refused, never resumed
    if not release_complete(run_dir, config.train.steps):
        resume = (run_dir / "recovery" / "journal.jsonl").exists()
        train(None if resume else config, run_dir, resume=resume)
    return json.loads((run_dir / "release" / "certificate.json").read_text())


def _mia(run_dir: Path, out: Path, settings: StudySettings, config: RunConfig) -> dict[str, Any]:
    """DIBA and the baselines on the run's members ``train[0:k]`` against ``train[k:2k]``."""
    from dpgrpo.audit.pipeline import run_mia
    from dpgrpo.audit.report import mia_summary, write_mia_report
    from dpgrpo.audit.scoring import SamplingSettings

    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        if "certified_auc_ceiling" not in summary:     # written before the ceiling existed
            from dpgrpo.audit.pipeline import read_run

            summary["certified_auc_ceiling"] = read_run(run_dir).auc_ceiling
        return summary
    k = settings.members
    sampling = SamplingSettings(n_samples=settings.audit_samples,
                                temperature=settings.audit_temperature,
                                max_new_tokens=settings.audit_max_new_tokens)
    task = config.data.task
    outcome = run_mia(run_dir, f"{task}:train[0:{k}]", f"{task}:train[{k}:{2 * k}]",
                      data_dir=config.data.data_dir, settings=sampling, seed=settings.audit_seed,
                      n_folds=settings.audit_folds)
    write_mia_report(out, outcome)
    return mia_summary(outcome)


def _canary(run_dir: Path, out: Path, settings: StudySettings) -> dict[str, Any]:
    from dpgrpo.audit.pipeline import run_canary_audit
    from dpgrpo.audit.report import canary_summary, write_canary_report
    from dpgrpo.audit.scoring import SamplingSettings

    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    sampling = SamplingSettings(n_samples=settings.audit_samples,
                                temperature=settings.audit_temperature,
                                max_new_tokens=settings.audit_max_new_tokens)
    outcome = run_canary_audit(run_dir, settings=sampling, seed=settings.audit_seed)
    write_canary_report(out, outcome)
    return canary_summary(outcome)


def _contrast(report: Mapping[str, Any], arm: str, comparator: str) -> dict[str, Any]:
    rows = report["contrasts"] + report["versus_base"]
    row = next((r for r in rows if r["arm"] == arm and r["comparator"] == comparator
                and r["scorer"] == "strict"), None)
    if row is None:
        raise ConfigError(f"the comparison has no contrast {arm} - {comparator}")
    mde = row.get("mde")
    if mde is None:      # the report gives it only for null results; the study always wants it
        z = NormalDist().inv_cdf
        mde = (z(0.975) + z(0.8)) * row["se"]
    return {"pp": row["difference"], "ci": list(row["ci"]), "mde": mde,
            "holm_p": row.get("holm_p"), "a": row["accuracy_a"], "b": row["accuracy_b"]}


def noise_to_signal(sigma: float, coordinates: int, expected_batch: float) -> float:
    """Expected norm of the averaged noise over the largest averaged clipped signal:
    ``sigma C sqrt(p) / (q n)`` divided by C (the paper's Appendix C-A puts MATH near 8)."""
    return sigma * math.sqrt(coordinates) / expected_batch


def _sweep(plan: Any, eps: float, steps: Steps) -> dict[str, Any]:
    """DP-GRPO at ``eps`` (sigma recalibrated, all else equal), evaluated, vs the control."""
    from dpgrpo.evaluation import stats
    from dpgrpo.protocol import eval_complete, evaluate
    from dpgrpo.reports.inputs import load_arms

    base = next(r for r in plan.runs if r.arm == "dp-grpo")
    control = next(r for r in plan.runs if r.arm == "zero-advantage")
    cfg = apply_overrides(base.config, ["privacy.noise_multiplier=none", f"privacy.epsilon={eps}"])
    run_dir = plan.out_dir / "sweep" / f"dp-grpo-eps{eps:g}"
    try:
        cert = steps.run(f"sweep eps={eps:g}: train", lambda: _train_once(cfg, run_dir))
    except PrivacyError as err:  # e.g. the noise-tail gate: this epsilon cannot be certified
        return {"epsilon": eps, "refused": str(err)}
    if not eval_complete(run_dir / "eval", plan.n_eval):
        steps.run(f"sweep eps={eps:g}: evaluate", lambda: evaluate(
            plan, run_dir / "eval", adapter=run_dir / "release", arm=f"dp-grpo-eps{eps:g}",
            seed=1))
    _, (a, b) = load_arms([run_dir / "eval", control.eval_dir], plan.base_dir)
    c = stats.contrast(a.correct["strict"], b.correct["strict"], draws=plan.settings.draws,
                       sign_draws=plan.settings.sign_draws)
    z = NormalDist().inv_cdf
    return {"epsilon": cert["epsilon"], "sigma": cert["sigma"], "dp_vs_control_pp": c.difference,
            "dp_vs_control_ci": list(c.ci), "mde": c.mde if c.mde is not None
            else (z(0.975) + z(0.8)) * c.se, "accuracy": c.accuracy_a,
            "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                               cert["expected_batch"])}


def run_study(config_path: str | Path, out_dir: str | Path, *,
              results_dir: str | Path = "docs/results", sweep: bool = False,
              say: Say = lambda message: None) -> dict[str, Any]:
    """Run (or resume) the whole study; write the results page; return the results dict."""
    from dpgrpo.protocol import plan_protocol, protocol_settings, run_protocol
    from dpgrpo.reports.study import write_results

    config_path = Path(config_path)
    data = read_toml(config_path)
    settings = StudySettings.from_table(data.pop("study", {}))
    table = data.pop("protocol", {})
    config = config_from_dict(data, source=str(config_path))
    out = Path(out_dir).resolve()
    steps = Steps(say, out / "steps.json")
    plan = plan_protocol(config, protocol_settings(table), out)
    protocol = steps.run("protocol (base, non-private, dp-grpo, control; train + eval)",
                         lambda: run_protocol(plan, progress=say))
    report = json.loads((out / "compare" / "report.json").read_text())
    leaky_cfg = apply_overrides(config, _overrides(settings.leaky))
    steps.run("leaky non-private run", lambda: _train_once(leaky_cfg, out / "audit" / "leaky"))
    leaky = steps.run("DIBA audit of the leaky run",
                      lambda: _mia(out / "audit" / "leaky", out / "audit" / "leaky-mia",
                                   settings, leaky_cfg))
    dp_leaky = None
    if settings.dp_leaky:
        dp_leaky_cfg = private_twin(leaky_cfg)
        steps.run("the leaky recipe under DP", lambda: _train_once(
            dp_leaky_cfg, out / "audit" / "dp-leaky"))
        dp_leaky = steps.run("DIBA audit of the leaky recipe under DP",
                             lambda: _mia(out / "audit" / "dp-leaky",
                                          out / "audit" / "dp-leaky-mia", settings, dp_leaky_cfg))
    private_cfg = apply_overrides(config, _overrides(settings.private_audit))
    dp_cert = steps.run("audited DP-GRPO run (members + canaries)",
                        lambda: _train_once(private_cfg, out / "audit" / "private"))
    private = steps.run("DIBA audit of the DP-GRPO run",
                        lambda: _mia(out / "audit" / "private", out / "audit" / "private-mia",
                                     settings, private_cfg))
    canary = steps.run("canary audit (one-run lower bound)",
                       lambda: _canary(out / "audit" / "private", out / "audit" / "canary",
                                       settings))
    sweeps = [_sweep(plan, eps, steps) for eps in (settings.sweep if sweep else ())]
    dp_run = next(s for s in plan.runs if s.arm == "dp-grpo")
    cert = protocol.certificates[dp_run.name]
    results = {
        "config": str(config_path), "out_dir": str(out), "steps": steps.rows,
        "plan": plan.to_dict(), "protocol_results": _jsonable(protocol.summaries),
        "report": report, "leaky_mia": leaky, "dp_leaky_mia": dp_leaky, "private_mia": private,
        "canary": canary,
        "private_audit_certificate": dp_cert, "dp_certificate": cert, "sweep": sweeps,
        "settings": {k: (dict(v) if isinstance(v, Mapping) else v)
                     for k, v in settings.__dict__.items()},
    }
    results["summary"] = summarize(results, steps.wall)
    write_results(results, Path(results_dir), figures=out / "compare", audits=out / "audit")
    return results


def private_twin(leaky: RunConfig) -> RunConfig:
    """The leaky run's config with its arm made private (sigma calibrated to the epsilon)."""
    from dpgrpo.arm_table import private_twin as twin_of

    try:
        twin = twin_of(leaky.train.arm)
    except ConfigError as err:
        raise ConfigError(f"study.dp_leaky: {err}") from None
    return apply_overrides(leaky, [f"train.arm={twin}", "privacy.noise_multiplier=none"])


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _auc(mia: Mapping[str, Any]) -> tuple[float, list[float]]:
    pooled = mia["diba"]["pooled"]
    return pooled["auc"], [pooled["extra"]["auc_ci_low"], pooled["extra"]["auc_ci_high"]]


def summarize(results: Mapping[str, Any], wall: float) -> dict[str, Any]:
    """The keys of ``cpu-study.json`` that the issue and the results page name."""
    report, cert = results["report"], results["dp_certificate"]
    nonprivate = _contrast(report, "non-private", "base")
    dp = _contrast(report, "dp-grpo", "zero-advantage")
    leaky_auc, leaky_ci = _auc(results["leaky_mia"])
    dp_auc, dp_ci = _auc(results["private_mia"])
    canary = results["canary"]
    dp_leaky = {}
    if results.get("dp_leaky_mia"):
        auc, ci = _auc(results["dp_leaky_mia"])
        dp_leaky = {"audit_dp_leaky_auc": auc, "audit_dp_leaky_auc_ci": ci,
                    "audit_dp_leaky_auc_ceiling": results["dp_leaky_mia"]["certified_auc_ceiling"]}
    return {
        "nonprivate_gain_pp": nonprivate["pp"], "nonprivate_gain_ci": nonprivate["ci"],
        "dp_gain_pp": _contrast(report, "dp-grpo", "base")["pp"],
        "dp_vs_control_pp": dp["pp"], "dp_vs_control_ci": dp["ci"],
        "dp_vs_control_mde": dp["mde"],
        "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                           cert["expected_batch"]),
        "audit_leaky_auc": leaky_auc, "audit_leaky_auc_ci": leaky_ci,
        "audit_dp_auc": dp_auc, "audit_dp_auc_ci": dp_ci,
        "audit_dp_auc_ceiling": results["private_mia"]["certified_auc_ceiling"], **dp_leaky,
        "canary_eps_lower_bound": canary["empirical_epsilon_lower_bound"],
        "certified_eps": canary["certified_epsilon"],
        "dp_grpo_certified_eps": cert["epsilon"],
        "sweep": [{k: s[k] for k in ("epsilon", "dp_vs_control_pp", "dp_vs_control_ci", "mde",
                                     "refused") if k in s} for s in results["sweep"]],
        "wall_seconds": round(wall, 1),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results["steps"]),
    }


__all__ = ["StudySettings", "noise_to_signal", "private_twin", "run_study",
           "summarize"]
