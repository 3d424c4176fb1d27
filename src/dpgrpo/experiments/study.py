"""The CPU-scale study: does training learn, and does the audit see leakage? One command.

``dpgrpo study configs/cpu-study.toml --out runs/cpu-study`` runs, on the embedded arithmetic
task and SmolLM2-135M:

1. the protocol (:mod:`dpgrpo.experiments.protocol`): the public base, non-private GRPO, DP-GRPO and the
   zero-advantage control at the same (n, q, sigma, T, C), each evaluated greedily on the eval
   split, with the comparison report (paired problem-cluster bootstrap, exact McNemar with
   Holm, MDE) and its figures;
2. a deliberately leaky non-private run on ``members`` training problems seen many times, and
   the DIBA audit (with the classic baselines) of those members against as many held-out
   problems of the same split;
3. with ``dp_leaky = true``, the same audit of the leaky recipe made private: its arm's
   private twin (:func:`dpgrpo.config.arms.private_twin`) at the study's epsilon, sigma
   calibrated, all else equal;
4. the same audit of a DP-GRPO run on the same members at the study's epsilon, whose slot
   universe also holds canaries: their one-run epsilon lower bound is printed beside the
   certified epsilon;
5. optionally (``--sweep``) DP-GRPO at larger epsilons, each contrasted with the control.

With a ``[study.warm_start]`` table, a public warm start is trained first (overrides of the
study's config that must move it off the study's training data, e.g. gold SFT without noise on
a public benchmark) and every protocol arm starts from its adapter (``model.init_adapter``;
each certificate records its path and sha256). It is evaluated beside the arms, so the page
shows what the public data alone gives and what private training adds to it. The audit runs
keep their own recipes and start from a fresh adapter.

Every step is resumable (a rerun into the same folder skips finished work) and timed (wall
seconds and peak RSS). The work is split into independent tasks (each audited run with its
audits, each protocol arm with its evaluation, the base evaluation, each sweep point); with
``workers = N`` they run in N spawned processes at once, each with cores / N torch threads
(on 2 cores, two single-thread processes get more done than one process with two threads), and
a final pass collects the results. The wall time is the union of the steps' time spans. The results page ``cpu-study.md`` and ``cpu-study.json`` are written to
``--results`` (default ``docs/results``); the figures are copied beside them.

The ``[study]`` table of the config (stripped before the run config is built) sets::

    [study]
    members = 32                        # audit members: train[0:32]; non-members: train[32:64]
    audit_samples = 8                   # DIBA responses per prompt and model
    audit_temperature = 0.5
    sweep = [32.0, 128.0]               # epsilons of --sweep
    dp_leaky = true                     # also audit the leaky recipe under DP (step 3)
    workers = 2                         # independent tasks in 2 processes at once
    audit_permutations = 50             # label shuffles of each DIBA audit's permutation test
    [study.leaky]                       # overrides of the leaky non-private run
    "train.steps" = 16
    [study.private_audit]               # overrides of the audited DP-GRPO run
    "audit.canaries" = 32
    [study.warm_start]                  # a public warm start for the protocol arms
    "train.arm" = "non-private-gold-sft"
    "data.task" = "gsm8k"
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Callable, Mapping, Sequence

from dpgrpo.config import RunConfig, apply_overrides, config_from_dict, read_toml
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.privacy.planning import noise_to_signal
from dpgrpo.training.runtime import PeakRSS

Say = Callable[[str], None]
STUDY_JSON, STUDY_MD = "cpu-study.json", "cpu-study.md"
SWEEP_STEP = "sweep eps="          # the name of every sweep step starts so
WARM_START = "warm-start"          # the public warm start's folder and arm label


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
    warm_start: Mapping[str, Any] = field(default_factory=dict)  # public warm start overrides
    audit_prompts_per_batch: int = 16   # prompts per sampling call (x audit_samples rows)
    audit_permutations: int = 50        # label shuffles of each DIBA audit's permutation test
    workers: int = 1                    # processes running independent tasks at once

    def __post_init__(self) -> None:
        if self.workers < 1 or self.audit_prompts_per_batch < 1:
            raise ConfigError("study.workers and study.audit_prompts_per_batch must be >= 1")
        if self.audit_permutations < 0:
            raise ConfigError("study.audit_permutations must be >= 0")
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


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())) if path.exists() else []


def _best(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["step"] not in best or row["seconds"] > best[row["step"]]["seconds"]:
            best[row["step"]] = row
    return list(best.values())


class Steps:
    """Wall time and peak RSS of each named step of the study.

    With ``record`` (a JSON file), each finished step is written there at once, and a step
    that a resumed study skips keeps the time and memory of the run that did its work (for each
    step name, the row with the most seconds), so an interrupted study still reports them.
    """

    def __init__(self, say: Say, record: Path | None = None, *,
                 others: Sequence[Path] = ()) -> None:
        self.say, self.record = say, record
        self._rows: list[dict[str, Any]] = _read_rows(record) if record is not None else []
        self._others = [row for path in others for row in _read_rows(path)]
        self.started = time.perf_counter()

    @property
    def rows(self) -> list[dict[str, Any]]:
        """For each step name, the row with the most seconds (the run that did its work),
        from this record and from the other workers' records."""
        return _best(self._rows + self._others)

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(f"{name} ...")
        start, t0 = time.time(), time.perf_counter()
        with PeakRSS(interval=0.05) as mem:
            out = fn()
        row = {"step": name, "seconds": round(time.perf_counter() - t0, 1),
               "peak_rss_bytes": mem.peak, "start": round(start, 1), "pid": os.getpid()}
        self._rows.append(row)
        if self.record is not None:
            from dpgrpo.rundir.checkpoint import atomic_write_json

            self.record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.record, _best(self._rows))
        self.say(f"{name}: {row['seconds']:.0f} s")
        return out

    @property
    def wall(self) -> float:
        """Seconds of study work: the length of the union of the steps' time spans, so steps
        run at once by several workers count once and a resumed study adds its steps' time;
        rows without a start time (older records) add their seconds."""
        return self.wall_of(lambda name: True)

    def wall_of(self, keep: Callable[[str], bool]) -> float:
        """:attr:`wall` of the steps whose name ``keep`` accepts."""
        rows = [r for r in self.rows if keep(r["step"])]
        spans = sorted((r["start"], r["start"] + r["seconds"]) for r in rows if "start" in r)
        total, end = sum(r["seconds"] for r in rows if "start" not in r), -math.inf
        for a, b in spans:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return round(total, 1)            # the rows hold tenths of a second


def _overrides(table: Mapping[str, Any]) -> list[str]:
    return [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
            for k, v in table.items()]


def _train_once(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Train (or resume, or skip when complete) one run; its certificate."""
    from dpgrpo.experiments.protocol import check_run_dir, release_complete
    from dpgrpo.rundir.layout import RunDir
    from dpgrpo.training.trainer import train

    check_run_dir(config, run_dir)   # a folder holding another run is refused, never resumed
    if not release_complete(run_dir, config.train.steps):
        resume = RunDir(run_dir).has_charges()
        train(None if resume else config, run_dir, resume=resume)
    return json.loads((run_dir / "release" / "certificate.json").read_text())


def _sampling(settings: StudySettings) -> Any:
    from dpgrpo.audit.scoring import SamplingSettings

    return SamplingSettings(n_samples=settings.audit_samples,
                            temperature=settings.audit_temperature,
                            max_new_tokens=settings.audit_max_new_tokens,
                            prompts_per_batch=settings.audit_prompts_per_batch)


def _mia(run_dir: Path, out: Path, settings: StudySettings, config: RunConfig) -> dict[str, Any]:
    """DIBA and the baselines on the run's members ``train[0:k]`` against ``train[k:2k]``."""
    from dpgrpo.audit.pipeline import run_mia
    from dpgrpo.audit.report import mia_summary, write_mia_report

    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        if "certified_auc_ceiling" not in summary:     # written before the ceiling existed
            from dpgrpo.audit.pipeline import read_run

            summary["certified_auc_ceiling"] = read_run(run_dir).auc_ceiling
        return summary
    k = settings.members
    task = config.data.task
    outcome = run_mia(run_dir, f"{task}:train[0:{k}]", f"{task}:train[{k}:{2 * k}]",
                      data_dir=config.data.data_dir, settings=_sampling(settings),
                      seed=settings.audit_seed,
                      n_folds=settings.audit_folds)
    write_mia_report(out, outcome)
    return mia_summary(outcome)


def _permutation(out: Path, settings: StudySettings) -> dict[str, Any] | None:
    """Add the permutation test (:func:`dpgrpo.audit.mia.permutation_test`) to the finished
    DIBA audit in ``out``, from the features it saved; its summary, or None while the audit is
    not finished (the final pass then does it)."""
    import numpy as np

    from dpgrpo.audit.features import DIBA_FEATURES
    from dpgrpo.audit.mia import permutation_test
    from dpgrpo.audit.report import permutation_sentence
    from dpgrpo.rundir.checkpoint import atomic_write_json

    summary_path, table = out / "summary.json", out / "candidates.jsonl"
    if not (summary_path.exists() and table.exists()):
        return None
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
    if "permutation" in summary or settings.audit_permutations < 1 or \
            len(rows) != summary["n_members"] + summary["n_nonmembers"]:  # still being written
        return summary
    x = np.array([[np.nan if r["features"][n] is None else r["features"][n]
                   for n in DIBA_FEATURES] for r in rows], dtype=np.float64)
    test = permutation_test(x, np.array([r["member"] for r in rows]),
                            permutations=settings.audit_permutations, seed=summary["seed"],
                            n_folds=summary["diba"]["n_folds"],
                            n_estimators=summary["diba"]["n_estimators"])
    summary["permutation"] = test.to_dict()
    atomic_write_json(summary_path, summary)
    with (out / "report.md").open("a") as f:
        f.write("\n## Permutation test\n\n" + permutation_sentence(summary["permutation"]) + "\n")
    return summary


def _canary(run_dir: Path, out: Path, settings: StudySettings) -> dict[str, Any]:
    from dpgrpo.audit.pipeline import run_canary_audit
    from dpgrpo.audit.report import canary_summary, write_canary_report

    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    outcome = run_canary_audit(run_dir, settings=_sampling(settings), seed=settings.audit_seed)
    write_canary_report(out, outcome)
    return canary_summary(outcome)


def _whitebox(cert: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The white-box mechanism audit (model-free, gradient canaries) at the DP-GRPO run's
    certificate: a check of the mechanism, which the canary and DIBA audits cannot be."""
    from dpgrpo.audit.mechanism_audit import audit_mechanism, setup_from_certificate
    from dpgrpo.rundir.checkpoint import atomic_write_json

    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    audit = audit_mechanism(setup_from_certificate(dict(cert)), calibrate=True).to_dict()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "summary.json", audit)
    return audit


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


def _sweep_run(plan: Any, eps: float, steps: Steps) -> tuple[Path, dict[str, Any] | str]:
    """Train and evaluate DP-GRPO at ``eps`` (sigma recalibrated, all else equal): its folder
    and certificate, or the reason it was refused."""
    from dpgrpo.experiments.protocol import eval_complete, evaluate

    base = next(r for r in plan.runs if r.arm == "dp-grpo")
    cfg = apply_overrides(base.config, ["privacy.noise_multiplier=none", f"privacy.epsilon={eps}"])
    run_dir = plan.out_dir / "sweep" / f"dp-grpo-eps{eps:g}"
    try:
        cert = steps.run(f"{SWEEP_STEP}{eps:g}: train", lambda: _train_once(cfg, run_dir))
    except PrivacyError as err:  # e.g. the noise-tail gate: this epsilon cannot be certified
        return run_dir, str(err)
    if not eval_complete(run_dir / "eval", plan.n_eval):
        steps.run(f"{SWEEP_STEP}{eps:g}: evaluate", lambda: evaluate(
            plan, run_dir / "eval", adapter=run_dir / "release", arm=f"dp-grpo-eps{eps:g}",
            seed=1))
    return run_dir, cert


def _sweep(plan: Any, eps: float, steps: Steps) -> dict[str, Any]:
    """DP-GRPO at ``eps`` (:func:`_sweep_run`) contrasted with the control."""
    from dpgrpo.evaluation import stats
    from dpgrpo.reports.inputs import load_arms

    control = next(r for r in plan.runs if r.arm == "zero-advantage")
    run_dir, cert = _sweep_run(plan, eps, steps)
    if isinstance(cert, str):
        return {"epsilon": eps, "refused": cert}
    _, (a, b) = load_arms([run_dir / "eval", control.eval_dir], plan.base_dir)
    c = stats.contrast(a.correct["strict"], b.correct["strict"], draws=plan.settings.draws,
                       sign_draws=plan.settings.sign_draws)
    z = NormalDist().inv_cdf
    return {"epsilon": cert["epsilon"], "sigma": cert["sigma"], "dp_vs_control_pp": c.difference,
            "dp_vs_control_ci": list(c.ci), "mde": c.mde if c.mde is not None
            else (z(0.975) + z(0.8)) * c.se, "accuracy": c.accuracy_a,
            "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                               cert["expected_batch"])}


@dataclass(frozen=True)
class _Study:
    """What every step of the study needs, rebuilt from the config file (also in a worker)."""

    config_path: Path
    out: Path
    settings: StudySettings
    config: RunConfig
    plan: Any

    @classmethod
    def load(cls, config_path: str | Path, out_dir: str | Path,
             overrides: Mapping[str, Any] | None = None) -> "_Study":
        """The study of ``config_path``, with ``overrides`` of its ``[study]`` settings (and
        ``seeds``: that many runs of every trained arm, private and non-private)."""
        from dpgrpo.experiments.protocol import plan_protocol, protocol_settings

        config_path = Path(config_path).resolve()
        data = read_toml(config_path)
        overrides = dict(overrides or {})
        table = data.pop("protocol", {})
        if "seeds" in overrides:      # --seeds N: N runs of every trained arm
            table = {**table, "seeds": overrides["seeds"], "non_private_seeds": overrides["seeds"]}
            del overrides["seeds"]
        settings = StudySettings.from_table({**data.pop("study", {}), **overrides})
        data.pop("tune", None)        # `dpgrpo tune`'s table (dpgrpo.experiments.tune)
        config = config_from_dict(data, source=str(config_path))
        out = Path(out_dir).resolve()
        protocol = protocol_settings(table)
        if not settings.warm_start:
            return cls(config_path, out, settings, config, plan_protocol(config, protocol, out))
        check_public_warm_start(_warm_config(config, settings), config, protocol.eval_split)
        arms = apply_overrides(config, [f"model.init_adapter={out / WARM_START / 'release'}"])
        plan = plan_protocol(arms, protocol, out)          # every arm starts from the warm start
        return cls(config_path, out, settings, config,
                   dataclasses.replace(plan, references=(out / WARM_START,)))

    @property
    def leaky(self) -> RunConfig:
        return apply_overrides(self.config, _overrides(self.settings.leaky))

    @property
    def private(self) -> RunConfig:
        return apply_overrides(self.config, _overrides(self.settings.private_audit))

    @property
    def warm_start(self) -> RunConfig:
        return _warm_config(self.config, self.settings)

    def audit(self, name: str) -> Path:
        return self.out / "audit" / name


def _warm_config(config: RunConfig, settings: StudySettings) -> RunConfig:
    return apply_overrides(config, _overrides(settings.warm_start))


def check_public_warm_start(warm: RunConfig, study: RunConfig, eval_split: str) -> None:
    """Refuse a warm start that would read the study's private training data or its eval set.

    The warm start's adapter is released inside every arm's adapter and is not covered by their
    certificates, so it must come from public data only: another task, or another split of the
    same task (the same task and split is the private training set itself). Its own eval split
    is public but would be learned by heart before it is scored, so it is refused too."""
    if warm.data.task == study.data.task and warm.data.split == study.data.split:
        raise PrivacyError(
            f"study.warm_start trains on the study's own training data (task "
            f"{study.data.task!r}, split {study.data.split!r}): a warm start is public input, "
            "not covered by the arms' certificates; give it a public task or split")
    if warm.data.task == study.data.task and warm.data.split == eval_split:
        raise ConfigError(f"study.warm_start trains on the study's eval split ({eval_split!r} "
                          f"of {study.data.task!r}): the arms would be scored on problems "
                          "their start has seen")
    if warm.model.init_adapter is not None:
        raise ConfigError("study.warm_start starts from model.init_adapter itself: give the "
                          "warm start a fresh adapter")


def _warm_start_train(st: _Study, steps: Steps) -> dict[str, Any]:
    """Train the public warm start (before any arm: they all start from it); its certificate."""
    return steps.run("public warm start: train",
                     lambda: _train_once(st.warm_start, st.out / WARM_START))


def _warm_start_eval(st: _Study, steps: Steps) -> None:
    """Score the warm start alone on the eval split, as the arms are scored."""
    from dpgrpo.experiments.protocol import eval_complete, evaluate
    from dpgrpo.rundir.layout import RunDir

    run_dir = st.out / WARM_START
    if not eval_complete(run_dir / "eval", st.plan.n_eval):
        steps.run("public warm start: evaluate", lambda: evaluate(
            st.plan, run_dir / "eval", adapter=RunDir(run_dir).release, arm=WARM_START,
            seed=None))


def _warm_start_steps(st: _Study, steps: Steps) -> dict[str, Any] | None:
    """The public warm start, trained and evaluated (None without one)."""
    from dpgrpo.model import adapter_digest
    from dpgrpo.rundir.layout import RunDir

    if not st.settings.warm_start:
        return None
    cert = _warm_start_train(st, steps)
    _warm_start_eval(st, steps)
    run_dir = st.out / WARM_START
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    release = RunDir(run_dir).release
    return {"overrides": dict(st.settings.warm_start), "certificate": cert,
            "accuracy": summary["accuracy"], "release": str(release),
            "sha256": adapter_digest(release)}


def _leaky_steps(st: _Study, steps: Steps) -> dict[str, Any]:
    cfg = st.leaky
    steps.run("leaky non-private run", lambda: _train_once(cfg, st.audit("leaky")))
    return steps.run("DIBA audit of the leaky run", lambda: _mia(
        st.audit("leaky"), st.audit("leaky-mia"), st.settings, cfg))


def _dp_leaky_steps(st: _Study, steps: Steps) -> dict[str, Any]:
    cfg = private_twin(st.leaky)
    steps.run("the leaky recipe under DP", lambda: _train_once(cfg, st.audit("dp-leaky")))
    return steps.run("DIBA audit of the leaky recipe under DP", lambda: _mia(
        st.audit("dp-leaky"), st.audit("dp-leaky-mia"), st.settings, cfg))


def _permutation_steps(st: _Study, steps: Steps, audit: str, what: str) -> Any:
    """The permutation test of a DIBA audit, once its features are saved."""
    if (st.audit(audit) / "candidates.jsonl").exists():
        return steps.run(f"permutation test of the {what}",
                         lambda: _permutation(st.audit(audit), st.settings))
    return None


def _private_steps(st: _Study, steps: Steps) -> tuple[dict[str, Any], ...]:
    cfg = st.private
    cert = steps.run("audited DP-GRPO run (members + canaries)",
                     lambda: _train_once(cfg, st.audit("private")))
    mia = steps.run("DIBA audit of the DP-GRPO run", lambda: _mia(
        st.audit("private"), st.audit("private-mia"), st.settings, cfg))
    canary = steps.run("canary audit (one-run lower bound)", lambda: _canary(
        st.audit("private"), st.audit("canary"), st.settings))
    return cert, mia, canary


def _arm_steps(st: _Study, steps: Steps, name: str) -> None:
    """Train and evaluate one run of the protocol, each phase a timed step."""
    from dpgrpo.experiments.protocol import check_existing, run_one

    spec = next(r for r in st.plan.runs if r.name == name)
    check_existing(spec)
    run_one(st.plan, spec, step=steps.run)


def _base_steps(st: _Study, steps: Steps) -> None:
    from dpgrpo.experiments.protocol import BASE_ARM, eval_complete, evaluate

    if not eval_complete(st.plan.base_dir, st.plan.n_eval):
        steps.run("base: evaluate", lambda: evaluate(st.plan, st.plan.base_dir, adapter=None,
                                                     arm=BASE_ARM, seed=None))


def _tasks(st: _Study, sweep: bool) -> dict[str, Callable[[Steps], Any]]:
    """The study's independent pieces of work, longest first (each resumable, each its own
    record of steps); the final pass then finds them done."""
    tasks: dict[str, Callable[[Steps], Any]] = {
        "private": lambda steps: _private_steps(st, steps),
        "leaky": lambda steps: _leaky_steps(st, steps)}
    if st.settings.dp_leaky:
        tasks["dp-leaky"] = lambda steps: _dp_leaky_steps(st, steps)
    for spec in st.plan.runs:
        tasks[spec.name] = functools.partial(_arm_steps, st, name=spec.name)
    for eps in st.settings.sweep if sweep else ():
        tasks[f"sweep-eps{eps:g}"] = functools.partial(_sweep_run, st.plan, eps)
    tasks["base"] = lambda steps: _base_steps(st, steps)
    if st.settings.warm_start:      # trained before the tasks start (run_study)
        tasks[f"{WARM_START}-eval"] = lambda steps: _warm_start_eval(st, steps)
    for audit, what in _PERMUTED:   # last: by then the audits (first) have saved their features
        if audit != "dp-leaky-mia" or st.settings.dp_leaky:
            tasks[f"{audit}-permutation"] = functools.partial(_permutation_steps, st,
                                                              audit=audit, what=what)
    return tasks


#: The DIBA audits that get a permutation test, with the name of their step.
_PERMUTED = (("private-mia", "DP-GRPO audit"), ("leaky-mia", "leaky audit"),
             ("dp-leaky-mia", "leaky recipe under DP"))


def _worker(config_path: str, out_dir: str, overrides: dict[str, Any], name: str, sweep: bool,
            threads: int, verbose: bool) -> None:
    """One task in a worker process (spawned: nothing but these public arguments crosses)."""
    import sys

    import torch

    torch.set_num_threads(threads)
    st = _Study.load(config_path, out_dir, overrides)
    say = (lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)) \
        if verbose else (lambda message: None)
    _tasks(st, sweep)[name](Steps(say, st.out / "steps" / f"{name}.json"))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _run_tasks(st: _Study, overrides: dict[str, Any], sweep: bool, say: Say,
               verbose: bool) -> None:
    """Every task, in this process or (``study.workers`` > 1) in that many worker processes
    at once, each with ``cores // workers`` torch threads."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    names = list(_tasks(st, sweep))
    workers = min(st.settings.workers, len(names))
    if workers == 1:
        tasks = _tasks(st, sweep)
        for name in names:
            tasks[name](Steps(say, st.out / "steps" / f"{name}.json"))
        return
    threads = max(1, _cores() // workers)
    say(f"{len(names)} tasks on {workers} workers, {threads} thread(s) each")
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_worker, str(st.config_path), str(st.out), overrides, name, sweep,
                               threads, verbose) for name in names]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            say("a task failed: waiting for the running ones (every task is resumable)")
            pool.shutdown(wait=True, cancel_futures=True)
            raise failed[0].exception()


def run_study(config_path: str | Path, out_dir: str | Path, *,
              results_dir: str | Path = "docs/results", sweep: bool = False,
              say: Say = lambda message: None, verbose: bool = False,
              workers: int | None = None, dp_leaky: bool | None = None,
              seeds: int | None = None) -> dict[str, Any]:
    """Run (or resume) the whole study; write the results page; return the results dict.

    The work is split into independent tasks (:func:`_tasks`), run by ``study.workers``
    processes; a final pass in this process then finds every step done and collects the
    results. ``workers``, ``dp_leaky`` and ``seeds`` override ``study.workers``,
    ``study.dp_leaky`` and both ``protocol.seeds`` and ``protocol.non_private_seeds``;
    ``verbose`` lets worker processes print their progress to standard error.
    """
    from dpgrpo.experiments.protocol import run_protocol
    from dpgrpo.reports.study import write_results
    from dpgrpo.rundir.lock import RunLock

    overrides = {k: v for k, v in (("workers", workers), ("dp_leaky", dp_leaky),
                                   ("seeds", seeds)) if v is not None}
    st = _Study.load(config_path, out_dir, overrides)
    settings, plan, out = st.settings, st.plan, st.out
    with RunLock(out / "steps", what="study folder"):
        if settings.warm_start:   # first, here: every protocol arm starts from its adapter
            _warm_start_train(st, Steps(say, out / "steps" / f"{WARM_START}.json"))
        _run_tasks(st, overrides, sweep, say, verbose)
        steps = Steps(say, out / "steps.json",
                      others=sorted((out / "steps").glob("*.json")))
        protocol = steps.run("comparison of the arms (report and figures)",
                             lambda: run_protocol(plan, progress=say))
        report = json.loads((out / "compare" / "report.json").read_text())
        warm = _warm_start_steps(st, steps)
        leaky = _leaky_steps(st, steps)
        dp_leaky = _dp_leaky_steps(st, steps) if settings.dp_leaky else None
        dp_cert, private, canary = _private_steps(st, steps)
        tests = {audit: _permutation_steps(st, steps, audit, what) for audit, what in _PERMUTED
                 if audit != "dp-leaky-mia" or settings.dp_leaky}
        leaky, private = tests["leaky-mia"] or leaky, tests["private-mia"] or private
        dp_leaky = tests.get("dp-leaky-mia") or dp_leaky
        sweeps = [_sweep(plan, eps, steps) for eps in (settings.sweep if sweep else ())]
        dp_run = next(s for s in plan.runs if s.arm == "dp-grpo")
        cert = protocol.certificates[dp_run.name]
        whitebox = steps.run("white-box mechanism audit (model-free)",
                             lambda: _whitebox(cert, st.audit("mechanism")))
    results = {
        "config": str(config_path), "out_dir": str(out), "steps": steps.rows,
        "command": " ".join(["dpgrpo study", str(config_path), *(["--sweep"] if sweep else []),
                             *(f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else
                               f"--{'' if v else 'no-'}{k.replace('_', '-')}"
                               for k, v in overrides.items())]),
        "workers": settings.workers,
        "plan": plan.to_dict(), "protocol_results": _jsonable(protocol.summaries),
        "report": report, "leaky_mia": leaky, "dp_leaky_mia": dp_leaky, "private_mia": private,
        "canary": canary, "whitebox": whitebox, "warm_start": warm,
        "private_audit_certificate": dp_cert, "dp_certificate": cert, "sweep": sweeps,
        "settings": {k: (dict(v) if isinstance(v, Mapping) else v)
                     for k, v in settings.__dict__.items()},
    }
    results["summary"] = summarize(results, steps.wall)
    results["summary"]["wall_seconds_without_sweep"] = round(
        steps.wall_of(lambda name: not name.startswith(SWEEP_STEP)), 1)
    write_results(results, Path(results_dir), figures=out / "compare", audits=out / "audit")
    return results


def private_twin(leaky: RunConfig) -> RunConfig:
    """The leaky run's config with its arm made private (sigma calibrated to the epsilon)."""
    from dpgrpo.config.arms import private_twin as twin_of

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


def _permuted(key: str, mia: Mapping[str, Any] | None) -> dict[str, Any]:
    """``<key>_p`` and ``<key>_null`` (central 95% of the null AUCs) of a permutation test."""
    test = (mia or {}).get("permutation")
    return {} if not test else {f"{key}_p": test["p_value"], f"{key}_null": test["null_band"]}


def _whitebox_keys(audit: Mapping[str, Any] | None) -> dict[str, Any]:
    """The white-box audit's keys (none for results from before the audit existed)."""
    if not audit:
        return {}
    return {"whitebox_eps_lower_bound": audit["whitebox_bound"]["epsilon_lower_bound"],
            "whitebox_count_ceiling": audit["whitebox_bound"].get("count_ceiling"),
            "whitebox_flagged": audit["flagged"]}


def _warm_start_keys(results: Mapping[str, Any], report: Mapping[str, Any], dp_gain: float,
                     nonprivate_gain: float) -> dict[str, Any]:
    """What the public warm start gives alone, and what DP-GRPO adds to it (none without one)."""
    warm = results.get("warm_start")
    if not warm:
        return {}
    alone = next(a for a in report["arms"] if a["name"] == WARM_START)["accuracy"]["strict"]
    base = next(a for a in report["arms"] if a["name"] == report["base"])["accuracy"]["strict"]
    over = _contrast(report, "dp-grpo", WARM_START)
    np_over = nonprivate_gain - (alone - base)
    return {"warm_start_accuracy": alone, "warm_start_gain_pp": alone - base,
            "dp_vs_warm_start_pp": over["pp"], "dp_vs_warm_start_ci": over["ci"],
            # undefined when non-private GRPO did not gain over its own start
            "retained_share_over_warm_start": (dp_gain - (alone - base)) / np_over
            if np_over > 0 else None}


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
                    "audit_dp_leaky_auc_ceiling": results["dp_leaky_mia"]["certified_auc_ceiling"],
                    **_permuted("audit_dp_leaky_auc", results["dp_leaky_mia"])}
    dp_gain = _contrast(report, "dp-grpo", "base")["pp"]
    return {**_warm_start_keys(results, report, dp_gain, nonprivate["pp"]),
        "nonprivate_gain_pp": nonprivate["pp"], "nonprivate_gain_ci": nonprivate["ci"],
        "dp_gain_pp": dp_gain,
        "retained_share": dp_gain / nonprivate["pp"] if nonprivate["pp"] else None,
        "trainable_params": cert["trainable_coordinates"],
        "completions_per_arm": cert["expected_batch"] * cert["group_size"] * cert["steps"],
        "dp_vs_control_pp": dp["pp"], "dp_vs_control_ci": dp["ci"],
        "dp_vs_control_mde": dp["mde"],
        "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                           cert["expected_batch"]),
        "audit_leaky_auc": leaky_auc, "audit_leaky_auc_ci": leaky_ci,
        **_permuted("audit_leaky_auc", results["leaky_mia"]),
        "audit_dp_auc": dp_auc, "audit_dp_auc_ci": dp_ci,
        **_permuted("audit_dp_auc", results["private_mia"]),
        "audit_dp_auc_ceiling": results["private_mia"]["certified_auc_ceiling"], **dp_leaky,
        "canary_eps_lower_bound": canary["empirical_epsilon_lower_bound"],
        "certified_eps": canary["certified_epsilon"],
        **_whitebox_keys(results.get("whitebox")),
        "dp_grpo_certified_eps": cert["epsilon"],
        "sweep": [{k: s[k] for k in ("epsilon", "dp_vs_control_pp", "dp_vs_control_ci", "mde",
                                     "refused") if k in s} for s in results["sweep"]],
        "wall_seconds": round(wall, 1),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results["steps"]),
    }


__all__ = ["StudySettings", "noise_to_signal", "private_twin", "run_study",
           "summarize"]
