"""What a comparison report shows (:class:`Comparison` and its parts), shared by
:mod:`dpgrpo.reports.compare` (which computes it) and :mod:`~dpgrpo.reports.tables` and
:mod:`~dpgrpo.reports.figures` (which render it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import ConfigError
from dpgrpo.evaluation import stats

HolmFamily = Literal["contrast", "report"]


@dataclass(frozen=True)
class Settings:
    """Analysis settings recorded with every report (Appendix C-C)."""

    draws: int = stats.DEFAULT_BOOTSTRAP_DRAWS
    sign_draws: int = stats.DEFAULT_SIGN_DRAWS
    seed: int = stats.DEFAULT_SEED
    level: float = 0.95
    alpha: float = 0.05
    power: float = 0.8
    holm_family: HolmFamily = "contrast"

    def __post_init__(self) -> None:
        if self.draws < 1 or self.sign_draws < 1:
            raise ConfigError("--draws and --sign-draws must be positive")
        if not 0 < self.level < 1 or not 0 < self.alpha < 1 or not 0 < self.power < 1:
            raise ConfigError("level, alpha and power must lie in (0, 1)")
        if self.holm_family not in ("contrast", "report"):
            raise ConfigError(f"holm family must be 'contrast' or 'report', "
                              f"got {self.holm_family!r}")


@dataclass(frozen=True)
class ContrastRow:
    """A named contrast: ``arm`` minus ``comparator`` under one scorer."""

    arm: str
    comparator: str
    scorer: str
    result: stats.Contrast

    def to_dict(self) -> JSON:
        return {"arm": self.arm, "comparator": self.comparator, "scorer": self.scorer,
                **self.result.to_dict()}


@dataclass(frozen=True)
class ArmSummary:
    """Per-arm accuracies (pp) per scorer and per seed, response lengths and cap rates."""

    name: str
    seeds: tuple[int | str, ...]
    paths: tuple[str, ...]
    accuracy: dict[str, float]                       # scorer -> mean over seeds, pp
    seed_accuracy: dict[str, tuple[float, ...]]      # scorer -> per seed, pp
    mean_tokens: float
    seed_mean_tokens: tuple[float, ...]
    cap_rate: float                                  # pp
    seed_cap_rate: tuple[float, ...]                 # pp


@dataclass(frozen=True)
class Comparison:
    """Everything ``report.md`` and ``report.json`` show."""

    n_problems: int
    base: str
    focal: str | None
    scorers: tuple[str, ...]
    arms: tuple[ArmSummary, ...]                     # base first
    contrasts: tuple[ContrastRow, ...]               # focal vs each comparator (Table II)
    versus_base: tuple[ContrastRow, ...]             # each arm vs base (Fig. 2)
    settings: Settings = field(default_factory=Settings)
    # each other arm vs each fixed arm (a public warm start: what training added to its start)
    versus_fixed: tuple[ContrastRow, ...] = ()

    def arm(self, name: str) -> ArmSummary:
        return next(a for a in self.arms if a.name == name)

    def to_dict(self) -> JSON:
        """The report's numbers as plain JSON-ready data."""
        return {
            "n_problems": self.n_problems, "base": self.base, "focal": self.focal,
            "scorers": list(self.scorers),
            "settings": {**self.settings.__dict__, "mde_formula": MDE_FORMULA},
            "arms": [stats.jsonable(a.__dict__) for a in self.arms],
            "contrasts": [c.to_dict() for c in self.contrasts],
            "versus_base": [c.to_dict() for c in self.versus_base],
            "versus_fixed": [c.to_dict() for c in self.versus_fixed],
        }


MDE_FORMULA = ("MDE = (z_{1-alpha/2} + z_{power}) * SE, SE = 100 * sd(d_j) / sqrt(n), "
               "d_j = per-problem difference of seed-averaged correctness")


__all__ = ["MDE_FORMULA", "ArmSummary", "Comparison", "ContrastRow", "HolmFamily", "Settings"]
