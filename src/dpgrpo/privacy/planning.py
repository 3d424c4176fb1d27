"""Plan a private run from public quantities alone (``dpgrpo privacy plan``): no data is read.

At a fixed epsilon the budget is rarely what limits DP-GRPO; the noise the optimizer sees is.
The averaged update carries noise of norm ``sigma C sqrt(p) / m`` against a clipped signal of
at most C, so the ratio ``r = sigma sqrt(p) / m`` (p trainable coordinates, m = q n expected
prompts a round) says how far a private step moves along the signal compared with a
non-private one: with AdamW, once noise dominates the second moment, about 1/r as far.
sigma grows only slowly with T and m at fixed epsilon ("TAN without a burn", Sander et al.
2023), so for a compute budget of m x G x T completions the plan lists, per candidate
(m, G, T), sigma, r and the compute, and a user picks the point with r near or below 1 that
still gives G completions enough for mixed groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dpgrpo.errors import ConfigError

DEFAULT_BATCHES = (4, 8, 12, 16, 24, 32, 64, 128)
DEFAULT_GROUPS = (4, 6, 8)


def noise_to_signal(sigma: float, coordinates: int, expected_batch: float) -> float:
    """Expected norm of the averaged noise over the largest averaged clipped signal:
    ``sigma C sqrt(p) / (q n)`` divided by C (the paper's Appendix C-A puts MATH near 8)."""
    return sigma * math.sqrt(coordinates) / expected_batch


@dataclass(frozen=True)
class PlanRow:
    """One candidate: m prompts x G completions x T rounds, and what DP costs there."""

    m: float
    G: int
    T: int
    completions: int          # m G T, expected
    sigma: float              # planning sigma at (n, m, T, epsilon, delta)
    noise_to_signal: float    # sigma sqrt(p) / m


def plan(n: int, epsilon: float, budget: int, coordinates: int, *, delta: float | None = None,
         batches: Sequence[float] = DEFAULT_BATCHES, groups: Sequence[int] = DEFAULT_GROUPS,
         ) -> list[PlanRow]:
    """Every (m, G, T) with m in ``batches`` (m <= n), G in ``groups`` and the largest T whose
    m G T completions fit ``budget``; rows sorted by noise-to-signal, then compute."""
    from dpgrpo.privacy.calibration import planning_sigma

    if n < 1 or budget < 1 or coordinates < 1:
        raise ConfigError(f"plan needs n, budget and p >= 1 (got {n}, {budget}, {coordinates})")
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ConfigError(f"plan needs a finite epsilon > 0, got {epsilon}")
    delta = 1.0 / (10 * n) if delta is None else delta
    if not 0 < delta < 1.0 / n:
        raise ConfigError(f"delta = {delta:g} must lie in (0, 1/n = {1.0 / n:g})")
    sigmas: dict[tuple[float, int], float] = {}
    rows = []
    for m in sorted(set(batches)):
        if not 0 < m <= n:
            continue
        for g in sorted(set(groups)):
            rounds = int(budget // (m * g))
            if rounds < 1:
                continue
            if (m, rounds) not in sigmas:
                sigmas[m, rounds] = planning_sigma(n, m, rounds, epsilon, delta)
            sigma = sigmas[m, rounds]
            rows.append(PlanRow(m=m, G=g, T=rounds, completions=int(round(m * g * rounds)),  # noqa: RUF046 - round() of a numpy float is a float before NumPy 2
                                sigma=sigma,
                                noise_to_signal=noise_to_signal(sigma, coordinates, m)))
    if not rows:
        raise ConfigError(f"no candidate fits a budget of {budget} completions "
                          f"(smallest m x G is {min(batches)} x {min(groups)})")
    return sorted(rows, key=lambda r: (r.noise_to_signal, -r.completions))


def plan_report(n: int, epsilon: float, budget: int, coordinates: int,
                delta: float | None, rows: Sequence[PlanRow]) -> dict[str, object]:
    """The plan as one JSON-able object (what ``--json`` prints)."""
    return {"n": n, "epsilon": epsilon, "delta": 1.0 / (10 * n) if delta is None else delta,
            "budget_completions": budget, "trainable_params": coordinates,
            "sigma_note": "planning sigma (pessimistic 1e-2 PLD grid, slightly above the "
                          "exact calibration a run performs)",
            "data_read": "none: every figure is a function of the public inputs",
            "rows": [asdict(r) for r in rows]}


__all__ = ["DEFAULT_BATCHES", "DEFAULT_GROUPS", "PlanRow", "noise_to_signal", "plan",
           "plan_report"]
