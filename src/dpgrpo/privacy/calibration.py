"""Sigma calibration: the smallest noise multiplier whose PLD epsilon meets a target.

Section VI-C of the paper: sigma is found by bisection so that T rounds compose to the target
epsilon at delta. One exact PLD evaluation at dp_accounting's default discretization costs
0.4-2 s (a Python loop), so the search is aimed on coarse grids and then certified by two exact
evaluations, one on each side of the root, in parallel when they are expensive. The result
never overshoots: ``epsilon(sigma) <= target`` is checked at the default discretization.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from scipy import optimize

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy.accounting import (
    DEFAULT_DISCRETIZATION,
    PrivacyLedger,
    RoundEvent,
    check_delta,
    default_delta,
    sampling_rate,
)
from dpgrpo.privacy.accounting import (
    epsilon as accounted_epsilon,
)
from dpgrpo.privacy.limits import min_sigma


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
    rounds: int
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


def _eps_single(q: float, sigma: float, rounds: int, delta: float, vdi: float) -> float:
    return accounted_epsilon([RoundEvent(q, sigma, rounds)], delta,
                             value_discretization_interval=vdi)


@dataclass
class _Search:
    """Bookkeeping for one calibration: the exact evaluations made so far."""

    q: float
    rounds: int
    delta: float
    target: float
    coarse: int = 0
    exact: dict[float, float] = field(default_factory=dict)
    fine_cost_estimate: float = math.inf  # seconds per exact evaluation, measured on the way

    def gap(self, sigma: float, vdi: float) -> float:
        self.coarse += 1
        return _eps_single(self.q, sigma, self.rounds, self.delta, vdi) - self.target


#: the largest sigma calibration considers (config caps privacy.noise_multiplier far higher)
SIGMA_CEILING = 1e4
#: a Newton step on the 1e-3 grid is taken only if it moves sigma by at most this fraction
NEWTON_TRUST = 0.1


class _NoBracket(Exception):
    """:func:`_bracket_decreasing` reached ``floor`` (``at_floor``) or ``ceiling`` unbracketed."""

    def __init__(self, at_floor: bool, x: float) -> None:
        super().__init__(f"no sign change before {'floor' if at_floor else 'ceiling'} {x:g}")
        self.at_floor = at_floor
        self.x = x


def _bracket_decreasing(f: Callable[[float], float], x0: float, *, floor: float,
                        ceiling: float, factor: float = 2.0) -> tuple[float, float]:
    """(lo, hi) with ``f(lo) > 0 >= f(hi)`` and ``hi <= factor * lo``, for f non-increasing.

    Steps geometrically from ``x0`` (times ``factor`` while f > 0, divided by it while f <= 0),
    clamped to [floor, ceiling] with ``0 < floor``, so no point tried is ever below ``floor``
    (in particular never <= 0) or above ``ceiling``. Raises :class:`_NoBracket` when f is still
    > 0 at ``ceiling`` or still <= 0 at ``floor``.
    """
    if not 0 < floor <= x0 <= ceiling or not factor > 1:
        raise ValueError(f"need 0 < floor <= x0 <= ceiling and factor > 1, got "
                         f"{floor}, {x0}, {ceiling}, {factor}")
    x = x0
    if f(x) > 0:
        while True:
            if x >= ceiling:
                raise _NoBracket(False, ceiling)
            lo, x = x, min(x * factor, ceiling)
            if f(x) <= 0:
                return lo, x
    while True:
        if x <= floor:
            raise _NoBracket(True, floor)
        hi, x = x, max(x / factor, floor)
        if f(x) > 0:
            return x, hi


def _grid_root(s: _Search, vdi: float, x0: float, floor: float) -> float | None:
    """Root of the epsilon gap on the ``vdi`` grid, bracketed from ``x0``; None if that grid
    still misses the target at :data:`SIGMA_CEILING` (its pessimism grows with T)."""
    try:
        lo, hi = _bracket_decreasing(lambda x: s.gap(x, vdi), x0, floor=floor,
                                     ceiling=SIGMA_CEILING)
    except _NoBracket as err:
        if err.at_floor:  # a coarse grid overstates epsilon: met here, met exactly
            raise PrivacyBudgetError(
                f"epsilon={s.target} is met by a noise multiplier below {floor:.3g}, the "
                "smallest the PLD accountant can evaluate (dpgrpo.privacy.limits: its grid "
                "would outgrow memory), so no sigma for it can be certified; choose a "
                f"smaller epsilon (q={s.q:.4g}, T={s.rounds}, delta={s.delta:.3g})") from None
        return None
    return float(optimize.brentq(lambda x: s.gap(x, vdi), lo, hi, rtol=1e-6))


def _coarse_root(s: _Search) -> tuple[float, float]:
    """Root of the coarse epsilon gap: brentq on a 1e-2 grid, then on finer grids.

    Returns (sigma estimate, d eps / d sigma), the estimate always within [floor, 1e4].
    Nothing here certifies privacy; it only aims the exact evaluations that follow.

    The 1e-2 grid's pessimism accumulates over the T rounds: at T = 10^6 (q = 0.1, delta =
    1/400) its root is sigma ~164 where the exact root is ~45 (epsilon 8 on the 1e-2 grid,
    1.9 on the 1e-3 one). A Newton step from so far off landed at sigma = -434, so a step is
    taken only within :data:`NEWTON_TRUST`; otherwise the 1e-3 grid is bracketed and solved
    itself. For the same reason a miss on the 1e-2 grid at sigma = 1e4 does not make the
    target unreachable; only an exact evaluation there does.
    """
    floor = min_sigma()
    sigma_from_bracket = False  # True: sigma is the 1e-3 grid's root, bracketed and solved
    sigma = _grid_root(s, 1e-2, 1.0, floor)
    if sigma is None:  # the 1e-2 grid misses even at the ceiling: does the exact one?
        s.exact[SIGMA_CEILING] = _eps_single(s.q, SIGMA_CEILING, s.rounds, s.delta,
                                             DEFAULT_DISCRETIZATION)
        if s.exact[SIGMA_CEILING] > s.target:
            raise PrivacyBudgetError(
                f"epsilon={s.target} is unreachable: sigma would exceed {SIGMA_CEILING:g} "
                f"(q={s.q:.4g}, T={s.rounds}, delta={s.delta:.3g})")
        sigma = _grid_root(s, 1e-3, SIGMA_CEILING, floor)
        if sigma is None:  # met exactly at the ceiling, missed on both coarse grids
            return SIGMA_CEILING, -1e-12
        sigma_from_bracket = True
    else:
        # Slope on the 1e-3 grid by a secant over a 1e-4 relative step, then one Newton step
        # on that grid, if the step is small enough for the gap to be near linear.
        g3 = s.gap(sigma, 1e-3)
        step = sigma * 1e-4
        slope = min((s.gap(sigma + step, 1e-3) - g3) / step, -1e-12)
        newton = sigma - g3 / slope
        if abs(newton - sigma) <= NEWTON_TRUST * sigma:
            sigma = newton
            g3 = s.gap(sigma, 1e-3)
        else:
            root = _grid_root(s, 1e-3, sigma, floor)
            if root is None:
                return SIGMA_CEILING, -1e-12
            sigma = root
            sigma_from_bracket = True
    if sigma_from_bracket:  # slope and gap at the 1e-3 grid's root
        step = sigma * 1e-4
        g3 = s.gap(sigma, 1e-3)
        slope = min((s.gap(sigma + step, 1e-3) - g3) / step, -1e-12)
    # The gap at sigma is extrapolated to the default grid (the pessimistic grid error shrinks
    # like vdi**2, measured exponent ~2.05) and one Newton step aims at the exact root.
    tic = time.perf_counter()
    g5 = s.gap(sigma, 5e-4)
    s.fine_cost_estimate = 5.0 * (time.perf_counter() - tic)  # exact grid: ~5x the 5e-4 cost
    v3, v5, vf = 1e-3, 5e-4, DEFAULT_DISCRETIZATION
    g_fine = g5 - (g3 - g5) * (v5**2 - vf**2) / (v3**2 - v5**2)
    guess = sigma - g_fine / slope
    # the same trust region: _certify walks from the guess, which only has to be positive
    guess = min(max(guess, sigma * (1 - NEWTON_TRUST), floor), sigma * (1 + NEWTON_TRUST),
                SIGMA_CEILING)
    return guess, slope


class _ExactWorker:
    """A helper process for one exact PLD evaluation in parallel with the caller's.

    The fine-grid PLD construction is a Python loop (GIL-bound), so threads do not help. A
    subprocess (not multiprocessing, which would re-import the caller's ``__main__``) is started
    early so its imports overlap with the coarse search.
    """

    def __init__(self) -> None:
        code = "from dpgrpo.privacy.calibration import _worker_main; _worker_main()"
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
        q, sigma, rounds, delta, vdi = json.loads(line)
        print(json.dumps(_eps_single(q, sigma, int(rounds), delta, vdi)), flush=True)


def _start_worker() -> _ExactWorker | None:
    try:
        return _ExactWorker()
    except OSError:  # sandboxes without subprocesses: evaluate sequentially
        return None


def calibrate(n: int, expected_batch: float, rounds: int, epsilon: float,
              delta: float | None = None, *, rel_tol: float = 5e-7,
              parallel: bool = True) -> Calibration:
    """Smallest noise multiplier whose PLD epsilon over T rounds (``rounds``) is at most
    ``epsilon``.

    Section VI-C: sigma is found by bisection so that T rounds compose to the target. Here the
    search is aimed on coarse discretizations (cheap) and then certified by two evaluations at
    dp_accounting's default discretization, run in parallel: one at ``sigma`` (meets the target)
    and one at ``sigma * (1 - rel_tol)`` (misses it). If the aim was off, exact bisection
    continues until both certificates hold, so the result never overshoots the target.
    """
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    check_delta(delta)
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise PrivacyBudgetError(f"target epsilon must be finite and > 0, got {epsilon}")
    if rounds < 1:
        raise PrivacyBudgetError(f"rounds must be >= 1, got {rounds}")
    pool = _start_worker() if parallel else None
    try:
        s = _Search(q, rounds, delta, epsilon)
        guess, _ = _coarse_root(s)
        if pool is not None and s.fine_cost_estimate < 0.75:  # cheap: a second process costs more
            pool.close()
            pool = None
        sigma_hi, sigma_lo = _certify(s, guess, rel_tol, pool)
    finally:
        if pool is not None:
            pool.close()
    r_eps, r_order = PrivacyLedger([RoundEvent(q, sigma_hi, rounds)]).rdp_epsilon(delta)
    return Calibration(sigma_hi, s.exact[sigma_hi], epsilon, delta, q, rounds, n, expected_batch,
                       sigma_lo, s.exact[sigma_lo], r_eps, r_order, len(s.exact), s.coarse)


def _exact_pair(s: _Search, a: float, b: float, pool: _ExactWorker | None) -> None:
    todo = [x for x in (a, b) if x not in s.exact]
    if pool is not None and len(todo) == 2:
        try:
            pool.submit(s.q, todo[1], s.rounds, s.delta, DEFAULT_DISCRETIZATION)
            s.exact[todo[0]] = _eps_single(s.q, todo[0], s.rounds, s.delta, DEFAULT_DISCRETIZATION)
            s.exact[todo[1]] = pool.result()
        except OSError:  # the helper process died: evaluate what is missing here
            pass
    for x in todo:
        if x not in s.exact:
            s.exact[x] = _eps_single(s.q, x, s.rounds, s.delta, DEFAULT_DISCRETIZATION)


def _certify(
    s: _Search, guess: float, rel_tol: float, pool: _ExactWorker | None
) -> tuple[float, float]:
    """Exact evaluations around ``guess`` until hi meets the target, lo misses it,
    lo >= hi(1-tol)."""
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


def planning_sigma(n: int, expected_batch: float, rounds: int, epsilon: float,
                   delta: float | None = None) -> float:
    """A quick sigma for planning (``dpgrpo privacy plan``), never for a run: the root of the
    epsilon gap on dp_accounting's pessimistic 1e-2 grid, which overstates epsilon, so this is
    a little above :func:`calibrate`'s sigma (by ~1e-3 relative at the CPU study's point) at
    a fraction of its cost. A run always calibrates exactly."""
    q = sampling_rate(n, expected_batch)
    delta = default_delta(n) if delta is None else delta
    check_delta(delta)
    if not epsilon > 0 or not math.isfinite(epsilon) or rounds < 1:
        raise PrivacyBudgetError(
            f"need a finite epsilon > 0 and rounds >= 1, got {epsilon}, {rounds}"
        )
    s = _Search(q, rounds, delta, epsilon)
    lo, hi = 0.05, 1.0
    while s.gap(hi, 1e-2) > 0:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:
            raise PrivacyBudgetError(f"epsilon={epsilon} is unreachable: sigma would exceed 1e4")
    if s.gap(lo, 1e-2) <= 0:
        raise PrivacyBudgetError(f"epsilon={epsilon} is met by sigma < {lo}; check the inputs")
    return float(optimize.brentq(lambda x: s.gap(x, 1e-2), lo, hi, rtol=1e-6))


def sigma(n: int, expected_batch: float, rounds: int, epsilon: float,
          delta: float | None = None, *, quick: bool = False) -> float:
    """The accountant's inverse: the smallest noise multiplier whose epsilon over T rounds at
    q = m / n and ``delta`` (default 1 / (10 n)) is at most ``epsilon`` (:func:`calibrate`,
    relative precision 5e-7, never above the target; its evidence is :class:`Calibration`).
    ``quick``: :func:`planning_sigma`, a little above it at a fraction of the cost, for
    planning only (``dpgrpo privacy plan``); a run always calibrates exactly."""
    if quick:
        return planning_sigma(n, expected_batch, rounds, epsilon, delta)
    return calibrate(n, expected_batch, rounds, epsilon, delta).sigma


def calibrate_sigma(n: int, expected_batch: float, rounds: int, epsilon: float,
                    delta: float | None = None) -> float:
    """Deprecated: :func:`sigma`."""
    warnings.warn("dpgrpo.privacy.calibration.calibrate_sigma is deprecated; use sigma",
                  DeprecationWarning, stacklevel=2)
    return sigma(n, expected_batch, rounds, epsilon, delta)


__all__ = ["Calibration", "calibrate", "calibrate_sigma", "planning_sigma", "sigma"]
