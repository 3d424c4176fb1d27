"""Privacy accounting for DP-GRPO: PLD epsilon, RDP cross-check, sigma calibration, ledger.

Every round of Algorithm 1 is one Poisson-subsampled Gaussian mechanism with sampling rate
``q = m / n`` and noise multiplier ``sigma`` (paper, Section III-C, Eq. (5)); T rounds compose to
the privacy profile ``delta_{q,sigma,T}(eps)`` of Eq. (6), which does not involve the group size G,
the clipping norm C, the loss or the verifier (Theorem 1).

* :func:`pld_epsilon` evaluates that profile with the privacy-loss-distribution accountant of
  Google's ``dp_accounting`` (add-or-remove neighbours, pessimistic connect-the-dots
  discretization), so every reported epsilon upper-bounds the ideal mechanism's (Section VI-C).
* :func:`rdp_epsilon` reports the Renyi-DP value beside it as a cross-check (Appendix A-F).
* :func:`dpgrpo.privacy.calibration.calibrate` (its own module, which builds on this one)
  finds the smallest sigma whose PLD epsilon meets a target; it never overshoots.
* :class:`PrivacyLedger` is the record of every round that touched data; epsilon is recomputed
  from it, never stored as the only truth.
* :func:`replace_one_epsilon` and :func:`group_epsilon` account the same ledger directly under
  replace-one neighbours and for a group of k prompts (one person's problems), at the same delta
  (:mod:`dpgrpo.privacy.group`); :mod:`dpgrpo.privacy.neighbours` labels them for the certificate.
* :func:`replace_one` and :func:`group_privacy` are the generic conversions of an (eps, delta)
  pair (Corollary 1, Proposition 1), for when only that pair is known.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy.group import ADD_OR_REMOVE, REPLACE, composed_pld
from dpgrpo.privacy.limits import check_accountable_sigma

NEIGHBOURING_RELATION = ADD_OR_REMOVE
ACCOUNTANT = "dp_accounting PLD (pessimistic connect-the-dots)"
DEFAULT_DISCRETIZATION = 1e-4  # dp_accounting's default value_discretization_interval


def accountant_version() -> str:
    """Version string of the dp-accounting package that computes every epsilon."""
    from importlib.metadata import version

    return f"dp-accounting {version('dp-accounting')}"


def default_delta(n: int) -> float:
    """The paper's delta = 1 / (10 n) for a universe of n public slots (Section VII-A)."""
    if n < 1:
        raise PrivacyBudgetError(f"n must be a positive number of slots, got {n}")
    return 1.0 / (10 * n)


@dataclass(frozen=True)
class RoundEvent:
    """``count`` rounds of the Poisson-subsampled Gaussian with rate q and multiplier sigma."""

    sampling_rate: float
    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampling_rate <= 1.0:
            raise PrivacyBudgetError(f"sampling rate q must lie in [0, 1], got {self.sampling_rate}")
        if not (self.noise_multiplier >= 0.0 and math.isfinite(self.noise_multiplier)):
            raise PrivacyBudgetError(f"noise multiplier must be finite and >= 0, got {self.noise_multiplier}")
        if int(self.count) != self.count or self.count < 1:
            raise PrivacyBudgetError(f"event count must be a positive integer, got {self.count}")

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0.0 or self.sampling_rate == 0.0

    def dp_event(self) -> dpa.DpEvent:
        """The equivalent frozen ``dp_accounting`` event."""
        one = dpa.PoissonSampledDpEvent(self.sampling_rate, dpa.GaussianDpEvent(self.noise_multiplier))
        return one if self.count == 1 else dpa.SelfComposedDpEvent(one, int(self.count))


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise PrivacyBudgetError(f"delta must lie in (0, 1), got {delta}")


def sampling_rate(n: int, expected_batch: float) -> float:
    """q = m / n, validated: 0 < m <= n."""
    if n < 1:
        raise PrivacyBudgetError(f"n must be a positive number of slots, got {n}")
    if not 0 < expected_batch <= n:
        raise PrivacyBudgetError(
            f"expected batch m must satisfy 0 < m <= n, got m={expected_batch}, n={n}")
    return expected_batch / n


def pld_epsilon(events: Sequence[RoundEvent], delta: float, *,
                value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """PLD epsilon at ``delta`` of the composition of ``events`` (add-or-remove neighbours).

    Returns ``inf`` if any sampled round has no noise (a non-private round), 0 for no events.
    """
    _check_delta(delta)
    if any(not e.is_private for e in events):
        return math.inf
    events = [e for e in events if e.sampling_rate > 0.0]
    if not events:
        return 0.0
    accountant = pld_privacy_accountant.PLDAccountant(
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=value_discretization_interval)
    for event in events:
        accountant.compose(event.dp_event())
    return float(accountant.get_epsilon(delta))


def rdp_epsilon(events: Sequence[RoundEvent], delta: float,
                orders: Sequence[float] | None = None) -> tuple[float, float]:
    """RDP epsilon at ``delta`` and its minimizing order, over dp_accounting's default grid."""
    _check_delta(delta)
    if any(not e.is_private for e in events):
        return math.inf, math.nan
    events = [e for e in events if e.sampling_rate > 0.0]
    if not events:
        return 0.0, math.nan
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # fractional orders that fail to converge are dropped
    try:
        accountant = rdp_privacy_accountant.RdpAccountant(orders) if orders else \
            rdp_privacy_accountant.RdpAccountant()
        for event in events:
            accountant.compose(event.dp_event())
        eps, order = accountant.get_epsilon_and_optimal_order(delta)
    finally:
        absl_logger.setLevel(level)
    return float(eps), float(order)


@dataclass(frozen=True)
class EpsilonReport:
    """Epsilon of T rounds at (q, sigma, delta), with the RDP value as a cross-check."""

    epsilon: float
    delta: float
    rdp_epsilon: float
    rdp_order: float
    q: float
    sigma: float
    rounds: int
    n: int
    expected_batch: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def compute_epsilon(n: int, expected_batch: float, rounds: int, sigma: float,
                    delta: float | None = None) -> EpsilonReport:
    """Epsilon of T rounds (``rounds``) with q = m / n and noise multiplier ``sigma``."""
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    _check_delta(delta)
    if rounds < 1:
        raise PrivacyBudgetError(f"rounds must be >= 1, got {rounds}")
    if not sigma > 0:
        raise PrivacyBudgetError(f"a private run needs sigma > 0, got {sigma}")
    check_accountable_sigma(sigma)
    events = [RoundEvent(q, sigma, rounds)]
    r_eps, r_order = rdp_epsilon(events, delta)
    return EpsilonReport(pld_epsilon(events, delta), delta, r_eps, r_order, q, sigma, rounds, n,
                         expected_batch)


# --------------------------------------------------------------------------------------------
# Ledger and conversions
# --------------------------------------------------------------------------------------------

@dataclass
class PrivacyLedger:
    """Every round that touched data, as (q, sigma, count) events (consecutive equal rounds merge).

    The trainer records one event per round, replayed rounds after a resume included (invariant
    5). ``epsilon`` recomputes the guarantee from the events alone.
    """

    events: list[RoundEvent] = field(default_factory=list)

    def record(self, sampling_rate: float, noise_multiplier: float, count: int = 1) -> None:
        new = RoundEvent(sampling_rate, noise_multiplier, count)
        last = self.events[-1] if self.events else None
        if last and (last.sampling_rate, last.noise_multiplier) == (sampling_rate, noise_multiplier):
            self.events[-1] = RoundEvent(sampling_rate, noise_multiplier, last.count + count)
        else:
            self.events.append(new)

    @property
    def rounds(self) -> int:
        return sum(e.count for e in self.events)

    def epsilon(self, delta: float) -> float:
        return pld_epsilon(self.events, delta)

    def rdp_epsilon(self, delta: float) -> tuple[float, float]:
        return rdp_epsilon(self.events, delta)

    def to_dict(self) -> dict:
        return {"neighbouring_relation": NEIGHBOURING_RELATION,
                "events": [asdict(e) for e in self.events]}

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyLedger":
        relation = data.get("neighbouring_relation", NEIGHBOURING_RELATION)
        if relation != NEIGHBOURING_RELATION:
            raise PrivacyBudgetError(f"unsupported neighbouring relation {relation!r}")
        return cls([RoundEvent(**e) for e in data["events"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "PrivacyLedger":
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> "PrivacyLedger":
        return cls.from_json(Path(path).read_text())

    @classmethod
    def compose(cls, ledgers: Iterable["PrivacyLedger"]) -> "PrivacyLedger":
        """One ledger for several runs released on the same data (Appendix A-E, last remark)."""
        out = cls()
        for ledger in ledgers:
            for e in ledger.events:
                out.record(e.sampling_rate, e.noise_multiplier, e.count)
        return out


# --------------------------------------------------------------------------------------------
# Replace-one and groups: the same ledger accounted under other neighbouring relations
# --------------------------------------------------------------------------------------------

def private_rounds(events: Sequence[RoundEvent]) -> tuple[tuple[float, float, int], ...] | None:
    """The rounds that cost privacy as (q, sigma, count); None if a sampled round had no noise."""
    if any(not e.is_private for e in events):
        return None
    return tuple((e.sampling_rate, e.noise_multiplier, int(e.count))
                 for e in events if e.sampling_rate > 0.0)


@functools.lru_cache(maxsize=128)
def _accountant_epsilon(rounds: tuple[tuple[float, float, int], ...], delta: float, k: int,
                        relation: str, vdi: float) -> float:
    if not rounds:
        return 0.0
    return float(composed_pld(rounds, k, relation, vdi).get_epsilon_for_delta(delta))


def replace_one_epsilon(events: Sequence[RoundEvent], delta: float, *,
                        value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """PLD epsilon at ``delta`` under replace-one neighbours (one prompt swapped for another):
    dp_accounting's REPLACE_ONE Poisson-subsampled Gaussian, tighter than Corollary 1."""
    _check_delta(delta)
    rounds = private_rounds(events)
    if rounds is None:
        return math.inf
    return _accountant_epsilon(rounds, delta, 1, REPLACE, value_discretization_interval)


def group_epsilon(events: Sequence[RoundEvent], delta: float, k: int, *,
                  value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """PLD epsilon at ``delta`` for k prompts added or removed together (one person's problems).

    Each round is the mixture of Gaussians with sensitivities 0..k weighted Binomial(k, q)
    (:mod:`dpgrpo.privacy.group`), composed over the ledger; k = 1 is :func:`pld_epsilon`.
    Tighter than Proposition 1. Any number of records per group (the contributor level).
    """
    _check_delta(delta)
    if int(k) != k or k < 1:
        raise PrivacyBudgetError(f"group size k must be a positive integer, got {k}")
    rounds = private_rounds(events)
    if rounds is None:
        return math.inf
    return _accountant_epsilon(rounds, delta, int(k), ADD_OR_REMOVE, value_discretization_interval)


def replace_one(epsilon: float, delta: float) -> tuple[float, float]:
    """Replace-one neighbours from add/remove: (2 eps, (1 + e^eps) delta) (Corollary 1)."""
    return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """A contributor of k prompts: (k eps, k e^((k-1) eps) delta) (Proposition 1)."""
    if k < 1:
        raise PrivacyBudgetError(f"group size k must be >= 1, got {k}")
    return k * epsilon, k * math.exp((k - 1) * epsilon) * delta


__all__ = ["ACCOUNTANT", "EpsilonReport", "NEIGHBOURING_RELATION", "PrivacyLedger",
           "RoundEvent", "accountant_version", "compute_epsilon",
           "default_delta", "group_epsilon", "group_privacy", "pld_epsilon", "private_rounds",
           "rdp_epsilon", "replace_one", "replace_one_epsilon", "sampling_rate"]
