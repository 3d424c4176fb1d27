"""The fixed protocol of Section VII-C on one benchmark: train every arm, evaluate, compare.

Arms: the public base (evaluated once), DP-GRPO, the zero-advantage control, filtered and gold
DP-SFT; optionally the ladder (``shuffled-reward``, ``positive-only``) and ``non-private``
GRPO (``non_private_seeds`` runs, default one, as in Sec. VIII-E). Each private arm runs once
per seed k = 1..K, all sharing n, q = m/n, sigma and T, hence epsilon (Corollary 2): sigma is
resolved once (given, or calibrated from ``privacy.epsilon``) and pinned as
``privacy.noise_multiplier`` in every private run.

Seed k is a distinct run (``runs/<arm>-seed<k>``), recorded as ``seed`` in its eval summary.
It is NOT the privacy seed: coins, rollouts, noise and the LoRA initialization stay on OS
entropy unless the config sets the debugging ``privacy.seed`` (runs are then not releasable;
seed k uses :func:`dpgrpo.privacy.seeds.run_seed`).

Settings (:class:`dpgrpo.config.experiments.ProtocolSettings`, every key typed and listed in
docs/config.md) come from CLI options, else from an optional ``[protocol]`` table of the TOML
config (stripped before the RunConfig is built), else from defaults; per-arm recipes default to
the paper's supervised ones (Appendix C-B: learning rate 5e-6 filtered, 2e-5 gold, C =
0.1143670583). A recipe may set ``train.*`` (not ``arm``,
``rounds``) and ``privacy.clip_norm`` only, so that the arms keep one budget::

    [protocol]                      # every key optional
    seeds = 2                       # runs of each private arm
    non_private = true              # add non-private GRPO ...
    non_private_seeds = 1           # ... with this many runs (the paper: one)
    arms = ["dp-grpo", "zero-advantage", "filtered-sft", "gold-sft"]   # ladder = true: + 2 arms
    eval_limit = 200                # first N problems of the eval split (default: all)
    [protocol.recipes.gold-sft]
    train.learning_rate = 2e-5

Layout of the output folder DIR::

    DIR/protocol.json          plan (public config, budget, runs) and per-run results
    DIR/base/                  the base's predictions.jsonl and summary.json
    DIR/runs/<arm>-seed<k>/    release/, recovery/ and eval/ of each run
    DIR/compare/               report.md, report.json and figures (``dpgrpo compare``)

A rerun into DIR skips runs with a complete release (all T rounds) and eval summary, resumes
interrupted runs (``train(None, run_dir, resume=True)``) and partial evaluations; a run folder
trained with another config raises ConfigError before any work.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from dpgrpo.config import RunConfig, apply_overrides
from dpgrpo.config.arms import FOCAL_ARM, ArmName, arm_spec
from dpgrpo.config.experiments import (
    BASE_ARM,
    DEFAULT_RECIPES,
    LADDER_ARMS,
    NON_PRIVATE_ARM,
    PRIMARY_ARMS,
    SFT_CLIP_NORM,
    ProtocolSettings,
)
from dpgrpo.config.json_types import JSON, JSONValue
from dpgrpo.config.loading import load_protocol_table
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.privacy.seeds import run_seed
from dpgrpo.release.files import certified_rounds
from dpgrpo.reports.budget import BudgetRow, resolve_budget
from dpgrpo.reports.compare import Settings
from dpgrpo.rundir.layout import RunDir, read_json_or_none


@dataclass(frozen=True)
class RunSpec:
    """One training run of the protocol."""

    arm: ArmName
    seed: int
    run_dir: Path
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.arm}-seed{self.seed}"

    @property
    def eval_dir(self) -> Path:
        return self.run_dir / "eval"      # outside release/: only RELEASE_FILES go there


@dataclass(frozen=True)
class ProtocolPlan:
    """Every run and evaluation of one protocol, fixed before any of them starts (A1)."""

    out_dir: Path
    config: RunConfig           # the benchmark config, before per-arm changes
    settings: ProtocolSettings
    budget: BudgetRow           # n, m, sigma, T, delta and epsilon shared by the private arms
    n_eval: int                 # problems each evaluation scores
    runs: tuple[RunSpec, ...]
    # evaluated public models compared beside the arms (run folders whose eval/ holds the
    # predictions on the same problems), e.g. the study's public warm start; none trains here
    references: tuple[Path, ...] = ()

    @property
    def base_dir(self) -> Path:
        return self.out_dir / "base"

    def to_dict(self) -> JSON:
        settings = {**asdict(self.settings),
                    "recipes": {a: dict(r) for a, r in self.settings.recipes.items()}}
        return {"task": self.config.data.task, "model": self.config.model.name,
                "config": self.config.to_dict(public=True), "settings": settings,
                "budget": self.budget.to_dict(), "n_eval": self.n_eval,
                "runs": [{"name": r.name, "arm": r.arm, "seed": r.seed,
                          "run_dir": str(r.run_dir)} for r in self.runs],
                "references": [str(p) for p in self.references]}


@dataclass(frozen=True)
class ProtocolResult:
    """What one invocation did and found."""

    plan: ProtocolPlan
    status: dict[str, str]                 # run name -> "trained", "resumed" or "complete"
    summaries: dict[str, JSON]   # "base" and run names -> eval summary
    certificates: dict[str, JSON]
    epsilon: float                         # largest certified epsilon of the private runs
    report: list[Path]                     # files written by compare


def protocol_settings(table: Mapping[str, JSONValue], **options: Any) -> ProtocolSettings:
    """Settings from a ``[protocol]`` table, then ``options`` (CLI values; None = not given),
    read by the config's one strict loader (:func:`dpgrpo.config.loading.load_protocol_table`:
    unknown keys and wrong types refused). Recipes of the table are merged key by key over
    :data:`DEFAULT_RECIPES`."""
    return load_protocol_table(table, **options)


def arm_config(config: RunConfig, arm: ArmName, seed: int, sigma: float,
               recipe: Sequence[str] = ()) -> RunConfig:
    """The RunConfig of ``arm``'s seed-``seed`` run: the arm, the shared sigma (None for the
    non-private arm), the debugging seed if the config has one, then the recipe overrides."""
    private = arm_spec(arm).private
    seed_value = run_seed(config.privacy.seed, seed)
    cfg = replace(config, train=replace(config.train, arm=arm),
                  privacy=replace(config.privacy, noise_multiplier=sigma if private else None,
                                  seed=seed_value))
    return apply_overrides(cfg, list(recipe))


def plan_protocol(config: RunConfig, settings: ProtocolSettings, out_dir: str | Path
                  ) -> ProtocolPlan:
    """Resolve the shared budget (calibrating sigma once if needed) and list every run."""
    from dpgrpo.tasks import load_split

    if settings.figures and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("figures need matplotlib: pip install 'dpgrpo[plot]' (or no figures)")
    out_dir = Path(out_dir).resolve()
    problems = load_split(config.data.task, settings.eval_split, config.data.data_dir,
                          source=config.data.source).problems
    n_eval = len(problems[:settings.eval_limit] if settings.eval_limit else problems)
    private = replace(config, train=replace(config.train, arm=FOCAL_ARM))
    budget = resolve_budget(private, config.data.task)
    runs = []
    for arm in settings.all_arms():
        count = settings.seeds if arm_spec(arm).private else settings.non_private_seeds
        for k in range(1, count + 1):
            cfg = arm_config(config, arm, k, budget.sigma, settings.recipe(arm))
            runs.append(RunSpec(arm, k, out_dir / "runs" / f"{arm}-seed{k}", cfg))
    return ProtocolPlan(out_dir, config, settings, budget, n_eval, tuple(runs))


def _differences(saved: object, wanted: object, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(wanted, dict):
        keys = dict.fromkeys((*saved, *wanted))
        return [d for k in keys for d in _differences(saved.get(k), wanted.get(k),
                                                      f"{prefix}{k}.")]
    return [] if saved == wanted else [prefix.rstrip(".")]


def _with_defaults(saved: object, defaults: object) -> JSONValue:
    """``saved`` with every key it lacks taken from ``defaults`` (recursively)."""
    if not (isinstance(saved, dict) and isinstance(defaults, dict)):
        return saved
    return {**defaults, **{k: _with_defaults(v, defaults.get(k)) for k, v in saved.items()}}


def check_existing(spec: RunSpec) -> None:
    """Raise ConfigError if ``spec.run_dir`` holds a run trained with another config."""
    check_run_dir(spec.config, spec.run_dir)


def check_run_dir(config: RunConfig, run_dir: Path) -> None:
    """Raise ConfigError if ``run_dir`` holds a run trained with a config other than ``config``.

    A config saved by an earlier dpgrpo lacks the keys added since; each counts as the value
    its run ran under (:func:`dpgrpo.rundir.migrate.as_written`: the default, unless the
    behaviour before the key differs from it), so such a run is refused only if the new config
    sets one of them otherwise.
    """
    from dpgrpo.release.write import public_config
    from dpgrpo.rundir.migrate import as_written

    layout = RunDir(run_dir)
    for path, public in ((layout.config_json, False), (layout.public_config_path, True)):
        saved = read_json_or_none(path)
        if saved is None:
            continue
        wanted = json.loads(json.dumps(config.to_dict(public=public)))
        if public:  # as release/ publishes it: no machine path, no chosen problems
            wanted = public_config(wanted)
        defaults = json.loads(json.dumps(RunConfig().to_dict(public=public)))
        diff = _differences(_with_defaults(as_written(saved), defaults), wanted)
        if diff:
            raise ConfigError(f"{run_dir} was trained with another config (differs in "
                              f"{', '.join(diff)}); use another output folder or the same "
                              "config and --set options")
        return


def release_complete(run_dir: Path, rounds: int) -> bool:
    """Whether ``run_dir/release`` holds the adapter and certificate of all T rounds
    (``rounds``)."""
    return RunDir(run_dir).release_complete(rounds)


def eval_complete(eval_dir: Path, n_eval: int) -> bool:
    """Whether ``eval_dir/summary.json`` covers all ``n_eval`` problems."""
    summary = read_json_or_none(eval_dir / "summary.json")
    return isinstance(summary, dict) and summary.get("n") == n_eval


def ensure_trained(spec: RunSpec) -> str:
    """Train the run, resume it, or leave a complete one: "trained", "resumed" or "complete"."""
    from dpgrpo.training.trainer import train

    if release_complete(spec.run_dir, spec.config.train.rounds):
        return "complete"
    if RunDir(spec.run_dir).config_json.exists():
        train(None, spec.run_dir, resume=True)
        return "resumed"
    train(spec.config, spec.run_dir)
    return "trained"


def evaluate(plan: ProtocolPlan, out_dir: Path, *, adapter: Path | None, arm: str,
             seed: int | None) -> JSON:
    """Greedy evaluation of the base or a release on the eval split; the same settings for all."""
    from dpgrpo.evaluation.evaluate import EvalSettings, run_eval
    from dpgrpo.training.setup import resolve_device

    cfg, st = plan.config, plan.settings
    return run_eval(EvalSettings(
        task=cfg.data.task, model=cfg.model.name, out_dir=out_dir,
        data_dir=Path(cfg.data.data_dir) if cfg.data.data_dir is not None else None,
        split=st.eval_split, adapter=adapter, limit=st.eval_limit, batch_size=st.eval_batch_size,
        max_new_tokens=st.eval_max_new_tokens or cfg.train.max_new_tokens, dtype=cfg.model.dtype,
        device=str(resolve_device(cfg.model.device)), arm=arm, seed=seed,
        source=cfg.data.source))


T = TypeVar("T")


class Step(Protocol):
    """``step(name, fn)``: run ``fn`` as the named step of a run (a timed one in the study) and
    return what it returns."""

    def __call__(self, name: str, fn: Callable[[], T], /) -> T: ...


def run_one(plan: ProtocolPlan, spec: RunSpec, *, step: Step | None = None
            ) -> tuple[str, JSON]:
    """Train (or resume, or leave) one run of the plan and evaluate it: its status
    ("trained", "resumed" or "complete") and eval summary. A run whose release and evaluation
    are both complete is read, not touched. ``step(name, fn)`` runs each phase (``dpgrpo
    study`` times them); by default it just calls ``fn``."""
    step = step or (lambda name, fn: fn())
    rounds = spec.config.train.rounds
    if release_complete(spec.run_dir, rounds) and eval_complete(spec.eval_dir, plan.n_eval):
        return "complete", read_json_or_none(spec.eval_dir / "summary.json")
    status = step(f"{spec.name}: train ({rounds} rounds)", lambda: ensure_trained(spec))
    summary = step(f"{spec.name}: evaluate", lambda: evaluate(
        plan, spec.eval_dir, adapter=RunDir(spec.run_dir).release, arm=spec.arm, seed=spec.seed))
    return status, summary


def check_shared_budget(certificates: Mapping[str, Mapping[str, JSONValue]]) -> float:
    """The largest epsilon of the private runs, after checking that they share n, q, sigma, T
    and delta (PrivacyError otherwise). A resumed run that replayed rounds is charged for them
    and may certify a larger epsilon than the others."""
    private = [(name, c) for name, c in certificates.items() if c.get("private")]
    for name, cert in private[1:]:
        diff = [k for k in ("n", "q", "sigma", "rounds", "delta")
                if _budget_term(cert, k) != _budget_term(private[0][1], k)]
        if diff:
            raise PrivacyError(f"run {name} differs from {private[0][0]} in {', '.join(diff)}: "
                               "every private arm of a protocol must share n, q, sigma and T")
    return max((float(c["epsilon"]) for _, c in private), default=math.inf)


def _budget_term(cert: Mapping[str, object], key: str) -> object:
    """``cert[key]``, T read from an old certificate's ``steps`` too (None when absent)."""
    return certified_rounds(cert, None) if key == "rounds" else cert.get(key)


def run_protocol(plan: ProtocolPlan, *, progress: Callable[[str], None] | None = None
                 ) -> ProtocolResult:
    """Train and evaluate every run of ``plan`` (resuming), then write the comparison.

    One protocol process per output folder: a second one gets RunLockedError naming the pid.
    """
    from dpgrpo.rundir.lock import RunLock

    with RunLock(plan.out_dir, what="protocol folder"):
        return _run_protocol(plan, progress)


def _run_protocol(plan: ProtocolPlan, progress: Callable[[str], None] | None) -> ProtocolResult:
    from dpgrpo.reports.compare import run_compare
    from dpgrpo.rundir.atomic import atomic_write_json

    say = progress or (lambda message: None)
    for spec in plan.runs:                       # refuse foreign run folders before any work
        check_existing(spec)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan.out_dir / "protocol.json", plan.to_dict())
    say(f"base: evaluating {plan.n_eval} problems")
    summaries = {BASE_ARM: evaluate(plan, plan.base_dir, adapter=None, arm=BASE_ARM, seed=None)}
    status: dict[str, str] = {}
    certificates: dict[str, dict[str, object]] = {}
    def step(name: str, fn: Callable[[], T]) -> T:
        say(f"{name} ...")
        return fn()

    for spec in plan.runs:
        status[spec.name], summaries[spec.name] = run_one(plan, spec, step=step)
        if status[spec.name] == "complete":
            say(f"{spec.name}: complete, skipped")
        # release/certificate.json of the run just completed (None only if it went missing)
        certificates[spec.name] = cast(JSON, RunDir(spec.run_dir).certificate())
    epsilon = check_shared_budget(certificates)
    say("comparing every arm with the base")
    analysis = Settings(draws=plan.settings.draws, sign_draws=plan.settings.sign_draws)
    _, report = run_compare([*(s.run_dir for s in plan.runs), *plan.references], plan.base_dir,
                            plan.out_dir / "compare", settings=analysis, write_json=True,
                            figures=plan.settings.figures, fixed=plan.references)
    results = _results(plan, status, summaries, certificates)
    atomic_write_json(plan.out_dir / "protocol.json", {**plan.to_dict(), "results": results})
    return ProtocolResult(plan, status, summaries, certificates, epsilon, report)


def _results(plan: ProtocolPlan, status: Mapping[str, str], summaries: Mapping[str, JSONValue],
             certificates: Mapping[str, JSONValue]) -> dict[str, object]:
    """Per run: what this invocation did, the accuracies and the certified budget."""
    keys = ("epsilon", "delta", "rounds_charged", "releasable")
    return {BASE_ARM: {"accuracy": summaries[BASE_ARM]["accuracy"]},
            **{s.name: {"status": status[s.name], "accuracy": summaries[s.name]["accuracy"],
                        **{k: certificates[s.name][k] for k in keys}} for s in plan.runs}}


__all__ = ["BASE_ARM", "DEFAULT_RECIPES", "LADDER_ARMS", "NON_PRIVATE_ARM", "PRIMARY_ARMS",
           "SFT_CLIP_NORM",
           "ProtocolPlan", "ProtocolResult", "ProtocolSettings", "RunSpec", "arm_config",
           "check_existing", "check_run_dir", "check_shared_budget", "ensure_trained",
           "eval_complete", "evaluate", "plan_protocol", "protocol_settings", "release_complete",
           "run_one", "run_protocol"]
