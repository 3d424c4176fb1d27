"""Privacy accounting for DP-GRPO: one entry point, :func:`epsilon` (issue 59).

Every round of Algorithm 1 is one Poisson-subsampled Gaussian mechanism with sampling rate
``q = m / n`` and noise multiplier ``sigma`` (paper, Section III-C, Eq. (5)); T rounds compose to
the privacy profile ``delta_{q,sigma,T}(eps)`` of Eq. (6), which does not involve the group size G,
the clipping norm C, the loss or the verifier (Theorem 1).

The accountant's surface is an event in, a number out, as dp_accounting's is (compose,
get_epsilon): the events are :class:`RoundEvent` (q, sigma, count), kept in a
:class:`PrivacyLedger`, and

* :func:`epsilon` ``(events, delta, relation=..., group=k)`` is their epsilon at ``delta``: the
  privacy-loss-distribution accountant of Google's ``dp_accounting`` (pessimistic
  connect-the-dots discretization, so every epsilon upper-bounds the ideal mechanism's,
  Section VI-C). The neighbouring relation is a parameter of the one function: one prompt added
  or removed (the certificate's epsilon), one swapped (``relation = REPLACE``: dp_accounting's
  REPLACE_ONE event, tighter than Corollary 1), or a group of k prompts of one person (``group =
  k``: each round the mixture of Gaussians with sensitivities 0..k weighted Binomial(k, q),
  :mod:`dpgrpo.privacy.group`, tighter than Proposition 1; k swapped: Corollary 1 on that curve);
* :func:`dpgrpo.privacy.calibration.sigma` is its inverse (a target epsilon in, sigma out;
  :func:`~dpgrpo.privacy.calibration.calibrate` returns the calibration's evidence too);
* :func:`epsilon_report` is epsilon of (n, m, T, sigma) with the Renyi-DP value beside it as a
  cross-check (Appendix A-F).

The older names (``compute_epsilon``, ``pld_epsilon``, ``rdp_epsilon``,
``replace_one_epsilon``, ``group_epsilon``, ``replace_one``, ``group_privacy``) still work and
warn (DeprecationWarning); CHANGELOG.md lists each with its replacement. The generic
conversions of a bare (epsilon, delta) pair (Corollary 1, Proposition 1) are
:func:`dpgrpo.privacy.neighbours.converted_figure`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dp_accounting as dpa
import numpy as np
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpgrpo.config.json_types import JSON
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
            raise PrivacyBudgetError(
                f"sampling rate q must lie in [0, 1], got {self.sampling_rate}"
            )
        if not (self.noise_multiplier >= 0.0 and math.isfinite(self.noise_multiplier)):
            raise PrivacyBudgetError(
                f"noise multiplier must be finite and >= 0, got {self.noise_multiplier}"
            )
        if int(self.count) != self.count or self.count < 1:
            raise PrivacyBudgetError(f"event count must be a positive integer, got {self.count}")

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0.0 or self.sampling_rate == 0.0

    def dp_event(self) -> dpa.DpEvent:
        """The equivalent frozen ``dp_accounting`` event."""
        one = dpa.PoissonSampledDpEvent(
            self.sampling_rate, dpa.GaussianDpEvent(self.noise_multiplier)
        )
        return one if self.count == 1 else dpa.SelfComposedDpEvent(one, int(self.count))


def check_delta(delta: float) -> None:
    """PrivacyBudgetError unless 0 < delta < 1."""
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


def _pld_epsilon(events: Sequence[RoundEvent], delta: float, *,
                 value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """PLD epsilon at ``delta`` of the composition of ``events`` (add-or-remove neighbours).

    Returns ``inf`` if any sampled round has no noise (a non-private round), 0 for no events.
    """
    check_delta(delta)
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


def _rdp_epsilon(events: Sequence[RoundEvent], delta: float,
                 orders: Sequence[float] | None = None) -> tuple[float, float]:
    """RDP epsilon at ``delta`` and its minimizing order, over dp_accounting's default grid."""
    check_delta(delta)
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


def epsilon_report(n: int, expected_batch: float, rounds: int, sigma: float,
                   delta: float | None = None) -> EpsilonReport:
    """Epsilon of T rounds (``rounds``) with q = m / n and noise multiplier ``sigma``, with the
    RDP cross-check beside it (``delta`` default: 1 / (10 n))."""
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    check_delta(delta)
    if rounds < 1:
        raise PrivacyBudgetError(f"rounds must be >= 1, got {rounds}")
    if not sigma > 0:
        raise PrivacyBudgetError(f"a private run needs sigma > 0, got {sigma}")
    check_accountable_sigma(sigma)
    events = [RoundEvent(q, sigma, rounds)]
    r_eps, r_order = _rdp_epsilon(events, delta)
    return EpsilonReport(_pld_epsilon(events, delta), delta, r_eps, r_order, q, sigma, rounds, n,
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
        if last and (last.sampling_rate, last.noise_multiplier) == (
            sampling_rate,
            noise_multiplier,
        ):
            self.events[-1] = RoundEvent(sampling_rate, noise_multiplier, last.count + count)
        else:
            self.events.append(new)

    @property
    def rounds(self) -> int:
        return sum(e.count for e in self.events)

    def epsilon(self, delta: float) -> float:
        """``epsilon(self.events, delta)``: the certificate's epsilon of the ledger."""
        return _pld_epsilon(self.events, delta)

    def rdp_epsilon(self, delta: float) -> tuple[float, float]:
        """The RDP cross-check at ``delta`` and its minimizing order."""
        return _rdp_epsilon(self.events, delta)

    def to_dict(self) -> JSON:
        return {"neighbouring_relation": NEIGHBOURING_RELATION,
                "events": [asdict(e) for e in self.events]}

    @classmethod
    def from_dict(cls, data: JSON) -> PrivacyLedger:
        relation = data.get("neighbouring_relation", NEIGHBOURING_RELATION)
        if relation != NEIGHBOURING_RELATION:
            raise PrivacyBudgetError(f"unsupported neighbouring relation {relation!r}")
        return cls([RoundEvent(**e) for e in data["events"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        return cls.from_json(Path(path).read_text())

    @classmethod
    def compose(cls, ledgers: Iterable[PrivacyLedger]) -> PrivacyLedger:
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


def _replace_group_epsilon(events: Sequence[RoundEvent], delta: float, k: int,
                           vdi: float) -> float:
    """Corollary 1 on the accountant's group-k curve delta_k (k swapped = k removed, then k
    added): (e1 + e2, delta_k(e1) + e^e1 delta_k(e2)), the smallest e1 + e2 on a 0.01 grid that
    meets ``delta`` (the paper's e1 = e2 rarely does: its e^e term outgrows delta_k's tail)."""
    rounds = private_rounds(events)
    if rounds is None:
        return math.inf
    if not rounds:
        return 0.0
    grid = np.arange(0.0, 200.0, 0.01)
    deltas = np.asarray(composed_pld(rounds, k, ADD_OR_REMOVE, vdi).get_delta_for_epsilon(grid))
    tail = np.maximum.accumulate(deltas[::-1])[::-1]  # max over e >= grid[j]: non-increasing
    first = np.flatnonzero(deltas < delta)
    budget = (delta - deltas[first]) * np.exp(-grid[first])  # what e^e1 delta_k(e2) may use
    second = np.searchsorted(-tail, -budget, side="left")  # first j with tail[j] <= budget
    ok = second < len(grid)
    if not ok.any():
        return math.inf
    return float(np.min(grid[first[ok]] + grid[second[ok]]))


#: the neighbouring relations :func:`epsilon` accounts
RELATIONS = (ADD_OR_REMOVE, REPLACE)


def check_relation(relation: str, group: int) -> None:
    """PrivacyBudgetError unless ``relation`` is one of :data:`RELATIONS` and ``group`` a
    positive integer."""
    if relation not in RELATIONS:
        raise PrivacyBudgetError(
            f"relation must be one of {', '.join(RELATIONS)}, got {relation!r}"
        )
    if isinstance(group, bool) or int(group) != group or group < 1:
        raise PrivacyBudgetError(f"group size must be a positive integer, got {group}")


def epsilon(events: Sequence[RoundEvent] | PrivacyLedger, delta: float, *,
            relation: str = ADD_OR_REMOVE, group: int = 1,
            value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """The accountant: epsilon at ``delta`` of the rounds ``events`` (or a ledger's), for
    ``relation`` applied to ``group`` prompts at once.

    * one prompt added or removed (the default; Definition 3, the certificate's epsilon):
      dp_accounting's PLD of the Poisson-subsampled Gaussian composed over the events;
    * ``group = k``: k prompts added or removed together (one person's problems; any number of
      records per group at the contributor level): each round the mixture of Gaussians with
      sensitivities 0..k weighted Binomial(k, q) (:mod:`dpgrpo.privacy.group`), tighter than
      Proposition 1;
    * ``relation = REPLACE``: one prompt swapped for another, dp_accounting's REPLACE_ONE event
      (tighter than Corollary 1); with ``group = k`` > 1, Corollary 1 on the group-k curve (k
      swapped = k removed, then k added), the smallest split on a 0.01 grid.

    ``inf`` if a sampled round had no noise, 0 for no rounds.
    """
    rounds = events.events if isinstance(events, PrivacyLedger) else events
    check_delta(delta)
    check_relation(relation, group)
    k, vdi = int(group), value_discretization_interval
    if relation == ADD_OR_REMOVE and k == 1:
        return _pld_epsilon(rounds, delta, value_discretization_interval=vdi)
    if relation == REPLACE and k > 1:
        return _replace_group_epsilon(rounds, delta, k, vdi)
    private = private_rounds(rounds)
    if private is None:
        return math.inf
    return _accountant_epsilon(private, delta, k, relation, vdi)


def _replace_one(epsilon: float, delta: float) -> tuple[float, float]:
    """Replace-one neighbours from add/remove: (2 eps, (1 + e^eps) delta) (Corollary 1)."""
    return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta


def _group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """A contributor of k prompts: (k eps, k e^((k-1) eps) delta) (Proposition 1)."""
    if k < 1:
        raise PrivacyBudgetError(f"group size k must be >= 1, got {k}")
    return k * epsilon, k * math.exp((k - 1) * epsilon) * delta


def generic_conversion(epsilon: float, delta: float, *, relation: str = ADD_OR_REMOVE,
                       group: int = 1) -> tuple[float, float]:
    """An add-or-remove-one (epsilon, delta) pair, with no ledger, converted to ``relation`` on
    ``group`` prompts: Proposition 1 for the group (k eps, k e^((k-1) eps) delta), then Corollary
    1 for a swap (2 eps, (1 + e^eps) delta). Loose: delta may exceed 1. The same relations as
    :func:`epsilon`, for when only the pair is known."""
    check_relation(relation, group)
    eps, dlt = _group_privacy(epsilon, delta, int(group))
    return _replace_one(eps, dlt) if relation == REPLACE else (eps, dlt)


# --------------------------------------------------------------------------------------------
# The names before issue 59, kept with a DeprecationWarning (CHANGELOG.md lists them)
# --------------------------------------------------------------------------------------------

def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"dpgrpo.privacy.accounting.{old} is deprecated; use {new}",
                  DeprecationWarning, stacklevel=3)


def compute_epsilon(n: int, expected_batch: float, rounds: int, sigma: float,
                    delta: float | None = None) -> EpsilonReport:
    """Deprecated: :func:`epsilon_report`."""
    _deprecated("compute_epsilon", "epsilon_report")
    return epsilon_report(n, expected_batch, rounds, sigma, delta)


def pld_epsilon(events: Sequence[RoundEvent], delta: float, *,
                value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """Deprecated: :func:`epsilon` ``(events, delta)``."""
    _deprecated("pld_epsilon", "epsilon(events, delta)")
    return _pld_epsilon(events, delta, value_discretization_interval=value_discretization_interval)


def rdp_epsilon(events: Sequence[RoundEvent], delta: float,
                orders: Sequence[float] | None = None) -> tuple[float, float]:
    """Deprecated: ``PrivacyLedger(events).rdp_epsilon(delta)`` or :func:`epsilon_report`."""
    _deprecated("rdp_epsilon", "PrivacyLedger(events).rdp_epsilon(delta) or epsilon_report")
    return _rdp_epsilon(events, delta, orders)


def replace_one_epsilon(events: Sequence[RoundEvent], delta: float, *,
                        value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """Deprecated: :func:`epsilon` ``(events, delta, relation=REPLACE)``."""
    _deprecated("replace_one_epsilon", "epsilon(events, delta, relation=REPLACE)")
    return epsilon(events, delta, relation=REPLACE,
                   value_discretization_interval=value_discretization_interval)


def group_epsilon(events: Sequence[RoundEvent], delta: float, k: int, *,
                  value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """Deprecated: :func:`epsilon` ``(events, delta, group=k)`` (which is the headline PLD for
    k = 1; this name kept the k = 1 mixture, equal to 1e-9)."""
    _deprecated("group_epsilon", "epsilon(events, delta, group=k)")
    check_delta(delta)
    if int(k) != k or k < 1:
        raise PrivacyBudgetError(f"group size k must be a positive integer, got {k}")
    rounds = private_rounds(events)
    if rounds is None:
        return math.inf
    return _accountant_epsilon(rounds, delta, int(k), ADD_OR_REMOVE,
                               value_discretization_interval)


def replace_one(epsilon: float, delta: float) -> tuple[float, float]:
    """Deprecated: :func:`generic_conversion` ``(epsilon, delta, relation=REPLACE)``."""
    _deprecated("replace_one", "generic_conversion(epsilon, delta, relation=REPLACE)")
    return _replace_one(epsilon, delta)


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """Deprecated: :func:`generic_conversion` ``(epsilon, delta, group=k)``."""
    _deprecated("group_privacy", "generic_conversion(epsilon, delta, group=k)")
    return _group_privacy(epsilon, delta, k)


#: deprecated name -> what replaces it (CHANGELOG.md, tests/privacy/test_accountant.py)
DEPRECATED = {"compute_epsilon": "epsilon_report", "pld_epsilon": "epsilon",
              "rdp_epsilon": "PrivacyLedger.rdp_epsilon / epsilon_report",
              "replace_one_epsilon": "epsilon(relation=REPLACE)",
              "group_epsilon": "epsilon(group=k)", "replace_one": "generic_conversion",
              "group_privacy": "generic_conversion"}


__all__ = ["ACCOUNTANT", "ADD_OR_REMOVE", "DEPRECATED", "NEIGHBOURING_RELATION", "RELATIONS",
           "REPLACE", "EpsilonReport",
           "PrivacyLedger", "RoundEvent", "accountant_version", "check_delta", "check_relation",
           "compute_epsilon", "default_delta", "epsilon", "epsilon_report", "generic_conversion",
           "group_epsilon", "group_privacy", "pld_epsilon", "private_rounds", "rdp_epsilon",
           "replace_one", "replace_one_epsilon", "sampling_rate"]
