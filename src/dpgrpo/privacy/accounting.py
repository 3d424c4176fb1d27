"""Privacy accounting for DP-GRPO: PLD epsilon, RDP cross-check, sigma calibration, ledger.

Every round of Algorithm 1 is one Poisson-subsampled Gaussian mechanism with sampling rate
``q = m / n`` and noise multiplier ``sigma`` (paper, Section III-C, Eq. (5)); T rounds compose to
the privacy profile ``delta_{q,sigma,T}(eps)`` of Eq. (6), which does not involve the group size G,
the clipping norm C, the loss or the verifier (Theorem 1).

* :func:`pld_epsilon` evaluates that profile with the privacy-loss-distribution accountant of
  Google's ``dp_accounting`` (add-or-remove neighbours, pessimistic connect-the-dots
  discretization), so every reported epsilon upper-bounds the ideal mechanism's (Section VI-C).
* :func:`rdp_epsilon` reports the Renyi-DP value beside it as a cross-check (Appendix A-F).
* :func:`calibrate` finds the smallest sigma whose PLD epsilon meets a target; it never
  overshoots: the returned sigma is certified by an evaluation at the default discretization.
* :class:`PrivacyLedger` is the record of every round that touched data; epsilon is recomputed
  from it, never stored as the only truth.
* :func:`replace_one` and :func:`group_privacy` convert the add/remove guarantee (Corollary 1,
  Proposition 1).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from dpgrpo.errors import PrivacyBudgetError

NEIGHBOURING_RELATION = "add-or-remove-one"
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
    steps: int
    n: int
    expected_batch: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def compute_epsilon(n: int, expected_batch: float, steps: int, sigma: float,
                    delta: float | None = None) -> EpsilonReport:
    """Epsilon of ``steps`` rounds with q = m / n and noise multiplier ``sigma``."""
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    _check_delta(delta)
    if steps < 1:
        raise PrivacyBudgetError(f"steps must be >= 1, got {steps}")
    if not sigma > 0:
        raise PrivacyBudgetError(f"a private run needs sigma > 0, got {sigma}")
    events = [RoundEvent(q, sigma, steps)]
    r_eps, r_order = rdp_epsilon(events, delta)
    return EpsilonReport(pld_epsilon(events, delta), delta, r_eps, r_order, q, sigma, steps, n,
                         expected_batch)


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate`.

    ``sigma`` meets the target (``epsilon <= target_epsilon`` at the default discretization) and
    ``sigma_below`` (< sigma, within ``rel_tol``) is certified to miss it, so sigma is the
    smallest such value to that relative precision.
    """

    sigma: float
    epsilon: float
    target_epsilon: float
    delta: float
    q: float
    steps: int
    n: int
    expected_batch: float
    sigma_below: float
    epsilon_below: float
    rdp_epsilon: float
    rdp_order: float
    exact_evaluations: int
    coarse_evaluations: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _eps_single(q: float, sigma: float, steps: int, delta: float, vdi: float) -> float:
    return pld_epsilon([RoundEvent(q, sigma, steps)], delta, value_discretization_interval=vdi)


@dataclass
class _Search:
    """Bookkeeping for one calibration: the exact evaluations made so far."""

    q: float
    steps: int
    delta: float
    target: float
    coarse: int = 0
    exact: dict[float, float] = field(default_factory=dict)
    fine_cost_estimate: float = math.inf  # seconds per exact evaluation, measured on the way

    def gap(self, sigma: float, vdi: float) -> float:
        self.coarse += 1
        return _eps_single(self.q, sigma, self.steps, self.delta, vdi) - self.target


def _coarse_root(s: _Search) -> tuple[float, float]:
    """Root of the coarse epsilon gap: brentq on a 1e-2 grid, then secant steps on finer grids.

    Returns (sigma estimate, d eps / d sigma). Nothing here certifies privacy; it only aims the
    two exact evaluations that follow.
    """
    def unreachable() -> PrivacyBudgetError:
        return PrivacyBudgetError(
            f"epsilon={s.target} is unreachable: sigma would exceed 1e4 "
            f"(q={s.q:.4g}, T={s.steps}, delta={s.delta:.3g})")

    if s.gap(1.0, 1e-2) > 0:  # too little noise at sigma = 1: grow
        lo, hi = 1.0, 2.0
        while s.gap(hi, 1e-2) > 0:
            lo, hi = hi, hi * 2.0
            if hi > 1e4:
                raise unreachable()
    else:  # enough noise: shrink until the target is missed
        lo, hi = 0.5, 1.0
        while s.gap(lo, 1e-2) <= 0:
            lo, hi = lo / 2.0, lo
            if lo < 1e-3:
                raise PrivacyBudgetError(f"epsilon={s.target} is met by sigma < 1e-3; check inputs")
    sigma = optimize.brentq(lambda x: s.gap(x, 1e-2), lo, hi, rtol=1e-6)
    # Slope on the 1e-3 grid by a secant over a 1e-4 relative step; the gap at sigma is then
    # extrapolated to the default grid (the pessimistic grid error shrinks like vdi**2,
    # measured exponent ~2.05) and one Newton step aims at the exact root.
    step = sigma * 1e-4
    g3 = s.gap(sigma, 1e-3)
    slope = min((s.gap(sigma + step, 1e-3) - g3) / step, -1e-12)
    sigma = sigma - g3 / slope  # one Newton step on the 1e-3 grid
    g3 = s.gap(sigma, 1e-3)
    tic = time.perf_counter()
    g5 = s.gap(sigma, 5e-4)
    s.fine_cost_estimate = 5.0 * (time.perf_counter() - tic)  # exact grid: ~5x the 5e-4 cost
    v3, v5, vf = 1e-3, 5e-4, DEFAULT_DISCRETIZATION
    g_fine = g5 - (g3 - g5) * (v5**2 - vf**2) / (v3**2 - v5**2)
    return sigma - g_fine / slope, slope


class _ExactWorker:
    """A helper process for one exact PLD evaluation in parallel with the caller's.

    The fine-grid PLD construction is a Python loop (GIL-bound), so threads do not help. A
    subprocess (not multiprocessing, which would re-import the caller's ``__main__``) is started
    early so its imports overlap with the coarse search.
    """

    def __init__(self) -> None:
        code = "from dpgrpo.privacy.accounting import _worker_main; _worker_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def submit(self, *args: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()

    def result(self) -> float:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise OSError("accounting worker exited")
        return float(json.loads(line))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _worker_main() -> None:
    for line in sys.stdin:
        q, sigma, steps, delta, vdi = json.loads(line)
        print(json.dumps(_eps_single(q, sigma, int(steps), delta, vdi)), flush=True)


def _start_worker() -> _ExactWorker | None:
    try:
        return _ExactWorker()
    except OSError:  # sandboxes without subprocesses: evaluate sequentially
        return None


def calibrate(n: int, expected_batch: float, steps: int, epsilon: float,
              delta: float | None = None, *, rel_tol: float = 5e-7,
              parallel: bool = True) -> Calibration:
    """Smallest noise multiplier whose PLD epsilon over ``steps`` rounds is at most ``epsilon``.

    Section VI-C: sigma is found by bisection so that T rounds compose to the target. Here the
    search is aimed on coarse discretizations (cheap) and then certified by two evaluations at
    dp_accounting's default discretization, run in parallel: one at ``sigma`` (meets the target)
    and one at ``sigma * (1 - rel_tol)`` (misses it). If the aim was off, exact bisection
    continues until both certificates hold, so the result never overshoots the target.
    """
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    _check_delta(delta)
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise PrivacyBudgetError(f"target epsilon must be finite and > 0, got {epsilon}")
    if steps < 1:
        raise PrivacyBudgetError(f"steps must be >= 1, got {steps}")
    pool = _start_worker() if parallel else None
    try:
        s = _Search(q, steps, delta, epsilon)
        guess, _ = _coarse_root(s)
        if pool is not None and s.fine_cost_estimate < 0.75:  # cheap: a second process costs more
            pool.close()
            pool = None
        sigma_hi, sigma_lo = _certify(s, guess, rel_tol, pool)
    finally:
        if pool is not None:
            pool.close()
    r_eps, r_order = rdp_epsilon([RoundEvent(q, sigma_hi, steps)], delta)
    return Calibration(sigma_hi, s.exact[sigma_hi], epsilon, delta, q, steps, n, expected_batch,
                       sigma_lo, s.exact[sigma_lo], r_eps, r_order, len(s.exact), s.coarse)


def _exact_pair(s: _Search, a: float, b: float, pool: _ExactWorker | None) -> None:
    todo = [x for x in (a, b) if x not in s.exact]
    if pool is not None and len(todo) == 2:
        try:
            pool.submit(s.q, todo[1], s.steps, s.delta, DEFAULT_DISCRETIZATION)
            s.exact[todo[0]] = _eps_single(s.q, todo[0], s.steps, s.delta, DEFAULT_DISCRETIZATION)
            s.exact[todo[1]] = pool.result()
            return
        except OSError:
            pass
    else:
        for x in todo:
            s.exact[x] = _eps_single(s.q, x, s.steps, s.delta, DEFAULT_DISCRETIZATION)


def _certify(s: _Search, guess: float, rel_tol: float, pool: _ExactWorker | None) -> tuple[float, float]:
    """Exact evaluations around ``guess`` until hi meets the target, lo misses it, lo >= hi(1-tol)."""
    half = 0.4 * rel_tol
    lo, hi = guess * (1 - half), guess * (1 + half)
    ok_hi = bad_lo = None  # certified points
    for _ in range(80):
        _exact_pair(s, lo, hi, pool)
        for x in (lo, hi):
            if s.exact[x] <= s.target:
                ok_hi = x if ok_hi is None else min(ok_hi, x)
            else:
                bad_lo = x if bad_lo is None else max(bad_lo, x)
        if ok_hi is not None and bad_lo is not None and bad_lo >= ok_hi * (1 - rel_tol):
            return ok_hi, bad_lo
        if ok_hi is None:  # both miss: step up geometrically
            width = (hi - lo) * 4
            lo, hi = hi, hi + width
        elif bad_lo is None:  # both meet: step down geometrically
            width = (hi - lo) * 4
            lo, hi = max(lo - width, lo / 2), lo
        else:  # bracketed but too wide: split in three with one parallel pair
            third = (ok_hi - bad_lo) / 3
            lo, hi = bad_lo + third, bad_lo + 2 * third
    raise PrivacyBudgetError("sigma calibration did not converge; please report this configuration")


def calibrate_sigma(n: int, expected_batch: float, steps: int, epsilon: float,
                    delta: float | None = None) -> float:
    """The smallest sigma (relative precision 5e-7) with PLD epsilon <= target; see :func:`calibrate`."""
    return calibrate(n, expected_batch, steps, epsilon, delta).sigma


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


def replace_one(epsilon: float, delta: float) -> tuple[float, float]:
    """Replace-one neighbours from add/remove: (2 eps, (1 + e^eps) delta) (Corollary 1)."""
    return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """A contributor of k prompts: (k eps, k e^((k-1) eps) delta) (Proposition 1)."""
    if k < 1:
        raise PrivacyBudgetError(f"group size k must be >= 1, got {k}")
    return k * epsilon, k * math.exp((k - 1) * epsilon) * delta
