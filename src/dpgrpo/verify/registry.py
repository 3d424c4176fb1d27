"""The registry of ``dpgrpo verify``'s checks: each measures one implementation invariant the
privacy analysis relies on and compares it with a tolerance; the record is machine-readable
(check, measured, tolerance, passed)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CheckResult:
    check: str
    group: str
    measured: float
    tolerance: float
    comparison: str  # "<=" or ">": how measured is compared with tolerance
    passed: bool
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    group: str
    tolerance: float
    comparison: str
    detail: str
    measure: Callable[[], float]

    def run(self) -> CheckResult:
        value = float(self.measure())
        ok = value <= self.tolerance if self.comparison == "<=" else value > self.tolerance
        return CheckResult(self.name, self.group, value, self.tolerance, self.comparison,
                           bool(ok and not math.isnan(value)), self.detail)


CHECKS: list[Check] = []


def check(name: str, *, tolerance: float, detail: str, comparison: str = "<=",
          group: str = "mechanism") -> Callable[[Callable[[], float]], Callable[[], float]]:
    """Register a measurement as a verification check."""
    def wrap(fn: Callable[[], float]) -> Callable[[], float]:
        CHECKS.append(Check(name, group, tolerance, comparison, detail, fn))
        return fn
    return wrap


__all__ = ["CHECKS", "Check", "CheckResult", "check"]
