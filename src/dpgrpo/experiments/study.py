"""The CPU-scale study: does training learn, and does the audit see leakage? One command.

``dpgrpo study configs/cpu-study.toml --out runs/cpu-study`` runs, on the embedded arithmetic
task and SmolLM2-135M:

1. the protocol (:mod:`dpgrpo.experiments.protocol`): the public base, non-private GRPO, DP-GRPO and
   the zero-advantage control at the same (n, q, sigma, T, C), each evaluated greedily on the eval
   split, with the comparison report (paired problem-cluster bootstrap, exact McNemar with Holm,
   MDE) and its figures;
2. a deliberately leaky non-private run on ``members`` training problems seen many times (drawn
   at random from the first ``2 members`` and recorded in ``audit/split.json``), and
   the DIBA audit (with the classic baselines) of those members against as many held-out
   problems of the same split;
3. with ``dp_leaky = true``, the same audit of the leaky recipe made private: its arm's
   private twin (:func:`dpgrpo.config.arms.private_twin`) at the study's epsilon, sigma
   calibrated, all else equal;
4. the same audit of a DP-GRPO run on the same members at the study's epsilon, whose slot
   universe also holds canaries: their one-run epsilon lower bound is printed beside the
   certified epsilon;
5. optionally (``--sweep``) DP-GRPO at larger epsilons, each contrasted with the control.

With a ``[study.warm_start]`` table, a public warm start is trained first, beside the audit
tasks (overrides of the study's config that must move it off the study's training data, e.g.
gold SFT without noise on a public benchmark), and every protocol arm starts from its adapter
(``model.init_adapter``; each certificate records its path and sha256). It is evaluated beside the
arms, so the page shows what the public data alone gives and what private training adds to it. The
audit runs keep their own recipes and start from a fresh adapter.

Every step is resumable (a rerun into the same folder skips finished work) and timed (wall
seconds and peak RSS). The work is split into independent tasks (each audited run with its
audits, each protocol arm with its evaluation, the base evaluation, each sweep point); with
``workers = N`` they run in N spawned processes at once, each with cores / N torch threads
(on 2 cores, two single-thread processes get more done than one process with two threads), and
a final pass collects the results. The wall time is the union of the steps' time spans. The results
page ``cpu-study.md`` and ``cpu-study.json`` are written to ``--results`` (default
``docs/results``); the figures are copied beside them.

The ``[study]`` table of the config (stripped before the run config is built) sets::

    [study]
    members = 32                        # audit members: 32 of train[0:64] drawn at random
                                        # (OS entropy; audit/split.json), the rest non-members
    audit_samples = 8                   # DIBA responses per prompt and model
    audit_temperature = 0.5
    sweep = [32.0, 128.0]               # epsilons of --sweep
    dp_leaky = true                     # also audit the leaky recipe under DP (step 3)
    workers = 2                         # independent tasks in 2 processes at once
    audit_permutations = 50             # label shuffles of each DIBA audit's permutation test
    audit_stop_after = 10               # ... stopped at the 10th null AUC >= the observed one
                                        # (Besag & Clifford 1991; 0: all 50, the fixed test)
    [study.leaky]                       # overrides of the leaky non-private run
    "train.rounds" = 16
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrpo.config import RunConfig, apply_overrides, config_from_dict, read_toml
from dpgrpo.config.arms import FOCAL_ARM
from dpgrpo.config.experiments import StudySettings
from dpgrpo.config.json_types import JSON
from dpgrpo.config.loading import load_protocol_table, load_study_table, split_tables
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.experiments.study_pool import run_in_workers
from dpgrpo.experiments.study_steps import (
    SPLIT_JSON,
    SWEEP_STEP,
    WARM_START,
    Say,
    Steps,
    base_samples_path,
    canary_audit,
    draw_base_samples,
    draw_split,
    mia_audit,
    override_list,
    permutation_audit,
    read_split,
    split_overrides,
    sweep_point,
    sweep_task,
    train_once,
    whitebox_audit,
)
from dpgrpo.experiments.study_summary import jsonable, summarize

if TYPE_CHECKING:
    from dpgrpo.experiments.protocol import ProtocolPlan


@dataclass(frozen=True)
class _Study:
    """What every step of the study needs, rebuilt from the config file (also in a worker)."""

    config_path: Path
    out: Path
    settings: StudySettings
    config: RunConfig
    plan: ProtocolPlan

    @classmethod
    def load(cls, config_path: str | Path, out_dir: str | Path,
             overrides: Mapping[str, object] | None = None) -> _Study:
        """The study of ``config_path``, with ``overrides`` of its ``[study]`` settings (and
        ``seeds``: that many runs of every trained arm, private and non-private)."""
        from dpgrpo.experiments.protocol import plan_protocol

        config_path = Path(config_path).resolve()
        data = read_toml(config_path)
        source = str(config_path)
        tables = split_tables(data, source=source)
        overrides = dict(overrides or {})
        seeds = overrides.pop("seeds", None)    # --seeds N: N runs of every trained arm
        settings = load_study_table(tables.get("study", {}), source=source, **overrides)
        config = config_from_dict(data, source=source)
        out = Path(out_dir).resolve()
        protocol = load_protocol_table(tables.get("protocol", {}), source=source, seeds=seeds,
                                       non_private_seeds=seeds)
        if not settings.warm_start:
            return cls(config_path, out, settings, config, plan_protocol(config, protocol, out))
        check_public_warm_start(_warm_config(config, settings), config, protocol.eval_split)
        arms = apply_overrides(config, [f"model.init_adapter={out / WARM_START / 'release'}"])
        plan = plan_protocol(arms, protocol, out)          # every arm starts from the warm start
        return cls(config_path, out, settings, config,
                   dataclasses.replace(plan, references=(out / WARM_START,)))

    @property
    def leaky(self) -> RunConfig:
        return self._audited_config(self.settings.leaky)

    @property
    def private(self) -> RunConfig:
        return self._audited_config(self.settings.private_audit)

    def _audited_config(self, table: Mapping[str, object]) -> RunConfig:
        """An audited run's config: its table's overrides, trained on the recorded split's
        members only (``data.indices``; :func:`draw_split`, done first by :func:`run_study`)."""
        split = read_split(self.audit(SPLIT_JSON))
        return apply_overrides(self.config, override_list(table) + split_overrides(split))

    def draw_split(self) -> JSON:
        """Draw (once) the audits' member/non-member split from the first ``2 members``
        problems of the audited runs' split, recorded in ``audit/split.json``."""
        pools = {(c.data.task, c.data.split, c.data.data_dir, c.data.source) for c in (
            apply_overrides(self.config, override_list(t))
            for t in (self.settings.leaky, self.settings.private_audit))}
        if len(pools) != 1:
            raise ConfigError("study.leaky and study.private_audit must train on the same "
                              "task, split and data (the audits share one member split)")
        pool = apply_overrides(self.config, override_list(self.settings.leaky))
        return draw_split(self.audit(SPLIT_JSON), self.settings.members, pool)

    @property
    def warm_start(self) -> RunConfig:
        return _warm_config(self.config, self.settings)

    def audit(self, name: str) -> Path:
        return self.out / "audit" / name


def _warm_config(config: RunConfig, settings: StudySettings) -> RunConfig:
    return apply_overrides(config, override_list(settings.warm_start))


def check_public_warm_start(warm: RunConfig, study: RunConfig, eval_split: str) -> None:
    """Refuse a warm start that would read the study's private training data or its eval set.

    The warm start's adapter is released inside every arm's adapter and is not covered by their
    certificates, so it must come from public data only: another task, or another split of the
    same task (the same task and split is the private training set itself). Its own eval split
    is public but would be learned by heart before it is scored, so it is refused too. Names are
    not enough: its training questions are then compared by content with the study's training
    set (PublicDataError) and eval set (ConfigError), by :mod:`dpgrpo.privacy.public_data`."""
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
    _check_warm_start_content(warm, study, eval_split)


def _check_warm_start_content(warm: RunConfig, study: RunConfig, eval_split: str) -> None:
    """The warm start's training questions hold none of the study's training or eval set."""
    from dpgrpo.privacy.public_data import check_disjoint
    from dpgrpo.tasks.splits import split_questions, training_questions

    public, task = training_questions(warm), study.data.task
    what = f"study.warm_start's training data ({warm.data.task!r}, split {warm.data.split!r})"
    check_disjoint(public, training_questions(study), what=what,
                   against=f"the study's private training set ({task!r}, {study.data.split!r})")
    check_disjoint(public, split_questions(task, eval_split, study.data.data_dir,
                                           study.data.source),
                   what=what, against=f"the study's eval set ({task!r}, {eval_split!r})",
                   error=ConfigError, reason="the arms would be scored on problems their start "
                                             "has seen")


def _warm_start_train(st: _Study, steps: Steps) -> JSON:
    """Train the public warm start (before any arm: they all start from it); its certificate."""
    return steps.run("public warm start: train",
                     lambda: train_once(st.warm_start, st.out / WARM_START))


def _warm_start_eval(st: _Study, steps: Steps) -> None:
    """Score the warm start alone on the eval split, as the arms are scored."""
    from dpgrpo.experiments.protocol import eval_complete, evaluate
    from dpgrpo.rundir.layout import RunDir

    run_dir = st.out / WARM_START
    if not eval_complete(run_dir / "eval", st.plan.n_eval):
        steps.run("public warm start: evaluate", lambda: evaluate(
            st.plan, run_dir / "eval", adapter=RunDir(run_dir).release, arm=WARM_START,
            seed=None))


def _warm_start_steps(st: _Study, steps: Steps) -> JSON | None:
    """The public warm start, trained and evaluated (None without one)."""
    from dpgrpo.model_adapters import adapter_digest
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


def _leaky_steps(st: _Study, steps: Steps) -> JSON:
    cfg = st.leaky
    steps.run("leaky non-private run", lambda: train_once(cfg, st.audit("leaky")))
    return steps.run("DIBA audit of the leaky run", lambda: mia_audit(
        st.audit("leaky"), st.audit("leaky-mia"), st.settings, cfg))


def _dp_leaky_steps(st: _Study, steps: Steps) -> JSON:
    cfg = private_twin(st.leaky)
    steps.run("the leaky recipe under DP", lambda: train_once(cfg, st.audit("dp-leaky")))
    return steps.run("DIBA audit of the leaky recipe under DP", lambda: mia_audit(
        st.audit("dp-leaky"), st.audit("dp-leaky-mia"), st.settings, cfg))


def _audited(st: _Study) -> list[RunConfig]:
    """The configs of the runs that get a DIBA audit."""
    return [st.leaky, st.private] + ([private_twin(st.leaky)] if st.settings.dp_leaky else [])


def _audit_base_steps(st: _Study, steps: Steps) -> None:
    """The base model's samples for the DIBA audits, drawn once for all of them (one file per
    base and task: :func:`dpgrpo.experiments.study_steps.base_samples_path`)."""
    audits = st.out / "audit"
    paths = {base_samples_path(audits, cfg): cfg for cfg in _audited(st)}
    for path, cfg in paths.items():
        if not path.exists():
            steps.run(f"DIBA: the base model's samples ({cfg.data.task})",
                      functools.partial(draw_base_samples, audits, st.settings, cfg))


def _permutation_steps(st: _Study, steps: Steps, audit: str, what: str
                       ) -> dict[str, object] | None:
    """The permutation test of a DIBA audit, once its features are saved."""
    if (st.audit(audit) / "candidates.jsonl").exists():
        return steps.run(f"permutation test of the {what}",
                         lambda: permutation_audit(st.audit(audit), st.settings))
    return None


def _private_steps(st: _Study, steps: Steps) -> tuple[JSON, ...]:
    cfg = st.private
    cert = steps.run("audited DP-GRPO run (members + canaries)",
                     lambda: train_once(cfg, st.audit("private")))
    mia = steps.run("DIBA audit of the DP-GRPO run", lambda: mia_audit(
        st.audit("private"), st.audit("private-mia"), st.settings, cfg))
    canary = steps.run("canary audit (one-run lower bound)", lambda: canary_audit(
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


def _tasks(st: _Study, sweep: bool) -> dict[str, Callable[[Steps], object]]:
    """The study's independent pieces of work, longest first (each resumable, each its own
    record of steps); the final pass then finds them done."""
    tasks: dict[str, Callable[[Steps], object]] = {}
    if st.settings.warm_start:      # first: every protocol arm waits for it (_prerequisite)
        tasks[WARM_START] = lambda steps: _warm_start_train(st, steps)
    tasks[AUDIT_BASE] = lambda steps: _audit_base_steps(st, steps)   # the audited runs wait
    tasks["private"] = lambda steps: _private_steps(st, steps)
    tasks["leaky"] = lambda steps: _leaky_steps(st, steps)
    if st.settings.dp_leaky:
        tasks["dp-leaky"] = lambda steps: _dp_leaky_steps(st, steps)
    for spec in st.plan.runs:
        tasks[spec.name] = functools.partial(_arm_steps, st, name=spec.name)
    for eps in st.settings.sweep if sweep else ():
        tasks[f"sweep-eps{eps:g}"] = functools.partial(sweep_task, st.plan, eps)
    tasks["base"] = lambda steps: _base_steps(st, steps)
    if st.settings.warm_start:
        tasks[f"{WARM_START}-eval"] = lambda steps: _warm_start_eval(st, steps)
    for audit, what in _PERMUTED:   # last: by then the audits (first) have saved their features
        if audit != "dp-leaky-mia" or st.settings.dp_leaky:
            tasks[f"{audit}-permutation"] = functools.partial(_permutation_steps, st,
                                                              audit=audit, what=what)
    return tasks


def _prerequisite(st: _Study, name: str, names: Sequence[str]) -> str | None:
    """The task that must be done before task ``name`` starts, or None.

    Every protocol arm, sweep point and the warm start's evaluation start from the warm
    start's adapter; a permutation test refits the attack on its audit's saved features.
    """
    if name.endswith("-mia-permutation"):
        return name.removesuffix("-mia-permutation")          # private, leaky, dp-leaky
    if name in _AUDITED and AUDIT_BASE in names:               # their DIBA audit reads it
        return AUDIT_BASE
    if WARM_START in names and name != WARM_START and (
            name == f"{WARM_START}-eval" or name.startswith("sweep-")
            or any(spec.name == name for spec in st.plan.runs)):
        return WARM_START
    return None


#: The tasks that train and DIBA-audit a run, and the one drawing their base's samples.
_AUDITED, AUDIT_BASE = ("private", "leaky", "dp-leaky"), "audit-base"

#: The DIBA audits that get a permutation test, with the name of their step.
_PERMUTED = (("private-mia", "DP-GRPO audit"), ("leaky-mia", "leaky audit"),
             ("dp-leaky-mia", "leaky recipe under DP"))


def _worker(config_path: str, out_dir: str, overrides: Mapping[str, object], name: str, sweep: bool,
            threads: int, verbose: bool) -> None:
    """One task in a worker process (spawned: nothing but these public arguments crosses)."""
    import sys

    import torch

    torch.set_num_threads(threads)
    st = _Study.load(config_path, out_dir, overrides)
    say = (lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)) \
        if verbose else (lambda message: None)
    _tasks(st, sweep)[name](Steps(say, st.out / "steps" / f"{name}.json"))


def _run_tasks(st: _Study, overrides: Mapping[str, object], sweep: bool, say: Say,
               verbose: bool) -> None:
    """Every task, in this process or (``study.workers`` > 1) in that many worker processes
    at once, each with ``cores // workers`` torch threads
    (:mod:`dpgrpo.experiments.study_pool`)."""
    names = list(_tasks(st, sweep))       # priority order; each after its prerequisite
    workers = min(st.settings.workers, len(names))
    if workers == 1:
        tasks = _tasks(st, sweep)
        for name in names:
            tasks[name](Steps(say, st.out / "steps" / f"{name}.json"))
        return
    after = {name: _prerequisite(st, name, names) for name in names}
    worker = functools.partial(_worker, str(st.config_path), str(st.out), overrides,
                               sweep=sweep, verbose=verbose)
    run_in_workers(names, after, workers, worker, say)


def run_study(config_path: str | Path, out_dir: str | Path, *,
              results_dir: str | Path = "docs/results", sweep: bool = False,
              say: Say = lambda message: None, verbose: bool = False,
              workers: int | None = None, dp_leaky: bool | None = None,
              seeds: int | None = None) -> JSON:
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
        st.draw_split()          # before any worker builds an audited run's config
        _run_tasks(st, overrides, sweep, say, verbose)
        steps = Steps(say, out / "steps.json",
                      others=sorted((out / "steps").glob("*.json")))
        protocol = steps.run("comparison of the arms (report and figures)",
                             lambda: run_protocol(plan, progress=say))
        report = json.loads((out / "compare" / "report.json").read_text())
        warm = _warm_start_steps(st, steps)
        leaky = _leaky_steps(st, steps)
        dp_leaky_mia = _dp_leaky_steps(st, steps) if settings.dp_leaky else None
        dp_cert, private, canary = _private_steps(st, steps)
        tests = {audit: _permutation_steps(st, steps, audit, what) for audit, what in _PERMUTED
                 if audit != "dp-leaky-mia" or settings.dp_leaky}
        leaky, private = tests["leaky-mia"] or leaky, tests["private-mia"] or private
        dp_leaky_mia = tests.get("dp-leaky-mia") or dp_leaky_mia
        sweeps = [sweep_point(plan, eps, steps) for eps in (settings.sweep if sweep else ())]
        dp_run = next(s for s in plan.runs if s.arm == FOCAL_ARM)
        cert = protocol.certificates[dp_run.name]
        whitebox = steps.run("white-box mechanism audit (model-free)",
                             lambda: whitebox_audit(cert, st.audit("mechanism")))
    results = {
        "config": str(config_path), "out_dir": str(out), "steps": steps.rows,
        "command": " ".join(["dpgrpo study", str(config_path), *(["--sweep"] if sweep else []),
                             *(f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else
                               f"--{'' if v else 'no-'}{k.replace('_', '-')}"
                               for k, v in overrides.items())]),
        "workers": settings.workers,
        "plan": plan.to_dict(), "protocol_results": jsonable(protocol.summaries),
        "report": report, "leaky_mia": leaky, "dp_leaky_mia": dp_leaky_mia, "private_mia": private,
        "canary": canary, "whitebox": whitebox, "warm_start": warm,
        "audit_split": read_split(st.audit(SPLIT_JSON)),   # the DIBA audits' members, drawn
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


__all__ = ["StudySettings", "check_public_warm_start", "private_twin", "run_study", "summarize"]
