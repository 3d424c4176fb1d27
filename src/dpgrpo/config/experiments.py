"""The experiment tables of a config file: ``[protocol]``, ``[study]`` and ``[tune]`` (issue 59).

Each is one frozen dataclass, loaded by the same strict loader as the run config's sections
(:func:`dpgrpo.config.loading.table_from_dict`: unknown keys and values of the wrong type are
refused with the file, the table and the key) and checked in ``__post_init__``; docs/config.md
is generated from the field comments here as from :mod:`dpgrpo.config.schema`. The commands
that read them are :mod:`dpgrpo.experiments.protocol`, :mod:`dpgrpo.experiments.study` and
:mod:`dpgrpo.experiments.tune`; a run's own config never sees them (they are stripped before
the RunConfig is built). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dpgrpo.config.arms import ARMS, FOCAL_ARM, ArmName, arms_with_role
from dpgrpo.config.values import check_choices, check_finite
from dpgrpo.errors import ConfigError

PRIMARY_ARMS: tuple[ArmName, ...] = arms_with_role("primary")   # the arm table's roles
LADDER_ARMS: tuple[ArmName, ...] = arms_with_role("ladder")
NON_PRIVATE_ARM, = arms_with_role("reference")  # the one sigma = 0 reference arm
BASE_ARM = "base"   # the public base model, evaluated once (not an arm of the table)
SFT_CLIP_NORM = 0.1143670583  # Appendix C-B
#: the paper's supervised recipes (Appendix C-B), under every ``[protocol.recipes.<arm>]``
DEFAULT_RECIPES: dict[str, dict[str, object]] = {
    "filtered-sft": {"train.learning_rate": 5e-6, "privacy.clip_norm": SFT_CLIP_NORM},
    "gold-sft": {"train.learning_rate": 2e-5, "privacy.clip_norm": SFT_CLIP_NORM},
}
#: the override keys a protocol recipe may not set: the arms share n, q, sigma and T
_RECIPE_FIXED = ("train.arm", "train.rounds")


@dataclass(frozen=True)
class ProtocolSettings:
    """``[protocol]``: which arms and seeds ``dpgrpo protocol`` runs, and how it evaluates and
    compares them (Section VII-C). CLI options override the table."""

    seeds: int = 2  # runs of each private arm (seed k = 1..K: distinct runs, not privacy seeds)
    # The trained arms (config.arms.ARMS; default the table's primary arms: dp-grpo,
    # zero-advantage, filtered-sft, gold-sft). The public base is always evaluated.
    arms: tuple[ArmName, ...] = PRIMARY_ARMS
    ladder: bool = False  # add the ladder arms shuffled-reward and positive-only (Section IX)
    non_private: bool = False  # add non-private GRPO (sigma = 0), non_private_seeds runs
    non_private_seeds: int = 1  # runs of the non-private arm (the paper: one)
    eval_limit: int | None = None  # score the first N problems of the eval split (default: all)
    eval_split: str = "eval"  # the split every arm and the base are scored on
    eval_batch_size: int = 8  # prompts per generate call when evaluating
    eval_max_new_tokens: int | None = None  # default: train.max_new_tokens, else the task's cap
    draws: int = 100_000  # bootstrap draws of the comparison (dpgrpo compare --draws)
    sign_draws: int = 1_000_000  # sign-randomization draws of the comparison
    figures: bool = True  # write the comparison's PNG figures (needs matplotlib)
    # [protocol.recipes.<arm>]: "section.key" = value overrides of one arm, train.* (not arm,
    # rounds) and privacy.clip_norm only, merged key by key over the paper's supervised
    # recipes (Appendix C-B: filtered-sft lr 5e-6, gold-sft lr 2e-5, both C = 0.1143670583)
    recipes: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: DEFAULT_RECIPES)

    def __post_init__(self) -> None:
        check_finite(self, "protocol")
        object.__setattr__(self, "arms", tuple(self.arms))
        for name in ("seeds", "non_private_seeds", "draws", "sign_draws"):
            if getattr(self, name) < 1:
                raise ConfigError(f"protocol.{name} must be >= 1, got {getattr(self, name)}")
        unknown = [a for a in (*self.arms, *self.recipes) if a not in ARMS]
        if unknown:
            raise ConfigError(f"unknown protocol arm {unknown[0]!r} (known: {', '.join(ARMS)}; "
                              f"the base '{BASE_ARM}' is always evaluated)")
        check_choices(self, "protocol")
        if len(set(self.arms)) != len(self.arms) or not self.arms:
            raise ConfigError(f"protocol.arms must be distinct and non-empty: {self.arms}")
        for name in ("eval_limit", "eval_batch_size", "eval_max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"protocol.{name} must be >= 1, got {value}")
        bad = [(arm, key) for arm, recipe in self.recipes.items() for key in recipe
               if not ((key.startswith("train.") and key not in _RECIPE_FIXED)
                       or key == "privacy.clip_norm")]
        if bad:
            raise ConfigError(f"protocol recipe for {bad[0][0]!r} sets {bad[0][1]!r}: arms must "
                              "share the data, model, n, q, sigma and T; a recipe may set train.* "
                              "(not arm, rounds) and privacy.clip_norm")

    def all_arms(self) -> tuple[ArmName, ...]:
        """The trained arms in run order: the chosen arms, then the ladder, then non-private."""
        extra = (*(LADDER_ARMS if self.ladder else ()),
                 *((NON_PRIVATE_ARM,) if self.non_private else ()))
        return tuple(dict.fromkeys((*self.arms, *extra)))

    def recipe(self, arm: str) -> list[str]:
        """The arm's ``section.key=value`` overrides."""
        return [f"{k}={v}" for k, v in self.recipes.get(arm, {}).items()]


@dataclass(frozen=True)
class StudySettings:
    """``[study]``: what ``dpgrpo study`` trains and attacks beside the protocol (public
    choices, fixed up front). Its override tables are ``"section.key" = value`` pairs."""

    # audit members: `members` of train[0:2 members] drawn at random with OS entropy (the
    # audited runs' data.indices), the rest the non-members; recorded in <out>/audit/split.json
    members: int = 32
    audit_samples: int = 8  # DIBA responses per prompt and model
    audit_temperature: float = 0.5  # sampling temperature of the audit's responses
    audit_max_new_tokens: int | None = None  # default: the task's completion cap
    audit_folds: int = 5  # cross-validation folds of the DIBA attack (<= members)
    audit_seed: int = 0  # public seed of the attack's folds and shuffles
    sweep: tuple[float, ...] = (32.0, 128.0)  # epsilons of `dpgrpo study --sweep` (each > 0)
    # [study.leaky]: overrides of the deliberately leaky non-private run the audit must detect
    leaky: Mapping[str, object] = field(default_factory=dict)
    dp_leaky: bool = False  # also audit the leaky recipe made private (its arm's private twin)
    # [study.private_audit]: overrides of the audited DP-GRPO run (e.g. "audit.canaries")
    private_audit: Mapping[str, object] = field(default_factory=dict)
    # [study.warm_start]: overrides of a public warm start every protocol arm starts from
    # (public data only: the study's own training or eval data is refused)
    warm_start: Mapping[str, object] = field(default_factory=dict)
    audit_prompts_per_batch: int = 16  # prompts per sampling call (x audit_samples rows)
    audit_permutations: int = 50  # label shuffles of each DIBA audit's permutation test
    # stop a permutation test at this many null AUCs >= the observed one (Besag & Clifford
    # 1991); 0: all of them, the fixed test
    audit_stop_after: int = 10
    workers: int = 1  # processes running independent tasks at once

    def __post_init__(self) -> None:
        check_finite(self, "study")
        object.__setattr__(self, "sweep", tuple(self.sweep))
        if self.workers < 1 or self.audit_prompts_per_batch < 1:
            raise ConfigError("study.workers and study.audit_prompts_per_batch must be >= 1")
        if self.audit_samples < 1 or self.audit_folds < 2:
            raise ConfigError("study.audit_samples must be >= 1 and study.audit_folds >= 2, got "
                              f"{self.audit_samples} and {self.audit_folds}")
        if self.audit_permutations < 0:
            raise ConfigError("study.audit_permutations must be >= 0")
        if self.audit_stop_after < 0:
            raise ConfigError("study.audit_stop_after must be >= 1, or 0 for the fixed test")
        if self.members < self.audit_folds:
            raise ConfigError(f"study.members must be >= study.audit_folds ({self.audit_folds})")
        if not self.audit_temperature > 0:
            raise ConfigError(f"study.audit_temperature must be > 0, got {self.audit_temperature}")
        if self.audit_max_new_tokens is not None and self.audit_max_new_tokens < 1:
            raise ConfigError("study.audit_max_new_tokens must be >= 1, got "
                              f"{self.audit_max_new_tokens}")
        if any(not e > 0 for e in self.sweep):
            raise ConfigError(f"study.sweep epsilons must be > 0, got {list(self.sweep)}")
        check_choices(self, "study")


#: override keys a grid point may set: the adapter, the optimizer, the objective and m (the
#: mechanism's epsilon, delta, n and T are the private run's and stay fixed)
TUNABLE_PREFIXES = ("model.lora_", "model.target_modules", "model.init_adapter", "train.",
                    "privacy.expected_batch", "privacy.clip_norm")
FIXED_KEYS = ("train.arm", "train.rounds")

#: the default grid (``dpgrpo tune`` without ``[tune.grid]``): today's adapter beside smaller ones
DEFAULT_GRID: dict[str, tuple[str, ...]] = {
    "lora-all": (),
    "ffa-B": ("model.lora_train=B",),
    "ffa-B-lr3e-2": ("model.lora_train=B", "train.learning_rate=3e-2"),
    "bias": ("model.lora_bias=true", "model.lora_train=bias", "train.learning_rate=3e-2"),
}


@dataclass(frozen=True)
class GridPoint:
    """One setting to try: a name and its ``section.key=value`` overrides."""

    name: str
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"grid point name {self.name!r} must be a plain folder name")
        for item in self.overrides:
            key = item.split("=", 1)[0].strip()
            if key in FIXED_KEYS or not key.startswith(TUNABLE_PREFIXES):
                raise ConfigError(
                    f"grid point {self.name!r} sets {key!r}: a point may set the adapter "
                    "(model.lora_*, model.target_modules, model.init_adapter), train.* (not arm "
                    "or rounds), privacy.expected_batch or privacy.clip_norm; epsilon, delta, n "
                    "and T are the private run's")


@dataclass(frozen=True)
class TuneSettings:
    """``[tune]``: the public proxy ``dpgrpo tune`` trains on, the grid and how points are
    scored (docs/tuning.md). CLI options override the table."""

    proxy: str  # the public proxy task (required here or as --proxy; never the private data)
    proxy_data_dir: str | None = None  # the proxy's data folder
    # [tune.grid]: point name -> a list of "section.key=value" overrides, or a table of
    # "section.key" = value (default: lora-all, ffa-B, ffa-B-lr3e-2 and bias)
    grid: tuple[GridPoint, ...] = field(
        default_factory=lambda: tuple(GridPoint(k, v) for k, v in DEFAULT_GRID.items()))
    eval_split: str = "eval"  # the proxy's split each point is scored on
    eval_limit: int | None = None  # score on the first N problems of it (default: all)
    # prompts per generate call when scoring (default: protocol.eval_batch_size, else 25)
    eval_batch_size: int = 25
    workers: int = 1  # processes training points at once
    seeds: int = 1  # runs per point; a point's score is their mean proxy accuracy

    def __post_init__(self) -> None:
        check_finite(self, "tune")
        if not self.proxy:
            raise ConfigError("name a public proxy task with --proxy or tune.proxy")
        if not self.grid:
            raise ConfigError("the tuning grid is empty")
        names = [p.name for p in self.grid]
        if len(set(names)) != len(names):
            raise ConfigError(f"grid point names must be distinct: {names}")
        if self.workers < 1 or self.eval_batch_size < 1 or self.seeds < 1:
            raise ConfigError("tune: workers, eval_batch_size and seeds must be >= 1")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ConfigError(f"tune.eval_limit must be >= 1, got {self.eval_limit}")


#: TOML table -> the dataclass behind it (docs/config.md lists them in this order)
EXPERIMENT_TABLES: dict[str, type] = {"protocol": ProtocolSettings, "study": StudySettings,
                                      "tune": TuneSettings}


__all__ = ["BASE_ARM", "DEFAULT_GRID", "DEFAULT_RECIPES", "EXPERIMENT_TABLES", "FIXED_KEYS",
           "FOCAL_ARM", "LADDER_ARMS", "NON_PRIVATE_ARM", "PRIMARY_ARMS", "SFT_CLIP_NORM",
           "TUNABLE_PREFIXES", "GridPoint", "ProtocolSettings", "StudySettings",
           "TuneSettings"]
