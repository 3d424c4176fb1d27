"""Besag and Clifford's sequential Monte Carlo p-value: stop drawing once the null has caught up.

Besag, J. and Clifford, P. (1991), "Sequential Monte Carlo p-values", Biometrika 78(2):301-304.
Null statistics are drawn one at a time; with ``h = stop_after`` and at most ``n = max_draws``
draws, the test

* stops at the ``h``-th null statistic ``>=`` the observed one, after ``L <= n`` draws, and
  gives ``p = h / L``;
* otherwise makes all ``n`` draws, of which ``g < h`` reach the observed statistic, and gives
  the fixed test's ``p = (g + 1) / (n + 1)``.

The p-value is valid, ``P(p <= alpha) <= alpha`` under the null (exchangeable draws), and up to
``h / (n + 1)`` it equals the fixed test's (both are ``(g + 1) / (n + 1)`` with ``g < h``), so
a test that finds signal is as sharp as the fixed one; without signal it stops after about
``h / P(null >= observed)`` draws. ``h >= n`` can only stop at the last draw with every draw
exceeding, where ``h / L = 1 = (n + 1) / (n + 1)``: it is the fixed test. Pure functions of the
drawn values, no model: :func:`dpgrpo.audit.mia.permutation_test` feeds them the refitted
attack's AUCs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Besag and Clifford's example ``h``; the study's and the CLI's default (a public choice).
DEFAULT_STOP_AFTER = 10


def check_rule(max_draws: int, stop_after: int | None) -> None:
    """Raise ValueError unless ``max_draws >= 1`` and ``stop_after`` is None or in 1..max_draws."""
    if max_draws < 1:
        raise ValueError(f"permutations must be >= 1, got {max_draws}")
    if stop_after is not None and not 1 <= stop_after <= max_draws:
        raise ValueError(f"stop_after must be None (the fixed test) or between 1 and the "
                         f"permutations ({max_draws}), got {stop_after}")


def front_end_rule(max_draws: int, stop_after: int | None) -> int | None:
    """The ``stop_after`` a front end passes on for a user's ``h``: None (the fixed test) for
    None, 0 or ``h >= max_draws``, which give the fixed test's p-value exactly; else ``h``."""
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after must be >= 0 (0: the fixed test), got {stop_after}")
    return stop_after if stop_after and stop_after < max_draws else None


def draw_sequentially(observed: float, nulls: Iterable[float], *, max_draws: int,
                      stop_after: int | None) -> np.ndarray:
    """The null statistics Besag and Clifford's rule draws from ``nulls``, in order.

    Takes one value at a time and never one past the stop: the ``stop_after``-th value
    ``>= observed`` or the ``max_draws``-th value (``stop_after=None``: always ``max_draws``).
    A lazy ``nulls`` (a generator) is therefore advanced exactly ``len(result)`` times.
    """
    check_rule(max_draws, stop_after)
    drawn: list[float] = []
    exceed = 0
    for value in nulls:
        drawn.append(float(value))
        exceed += int(drawn[-1] >= observed)
        if len(drawn) == max_draws or exceed == stop_after:
            return np.array(drawn)
    raise ValueError(f"the null ran out after {len(drawn)} of {max_draws} draws")


def draw_both_tails(observed: float, nulls: Iterable[float], *, max_draws: int,
                    stop_after: int | None) -> np.ndarray:
    """The draws a two-sided test needs: Besag and Clifford's rule run on each tail at once
    (values ``>= observed`` and values ``<= observed``), stopping when both tails have stopped
    (or at ``max_draws``). Each tail's p-value (:func:`sequential_p_value`, on ``null`` and on
    ``-null``) reads only the draws before its own stop, so each is exactly its one-sided
    sequential p-value; their two-sided combination is :func:`two_sided_p_value`."""
    check_rule(max_draws, stop_after)
    drawn: list[float] = []
    up = down = 0
    for value in nulls:
        drawn.append(float(value))
        up += int(drawn[-1] >= observed)
        down += int(drawn[-1] <= observed)
        if len(drawn) == max_draws or (stop_after is not None and min(up, down) >= stop_after):
            return np.array(drawn)
    raise ValueError(f"the null ran out after {len(drawn)} of {max_draws} draws")


def two_sided_p_value(observed: float, null: np.ndarray, *, max_draws: int,
                      stop_after: int | None) -> float | None:
    """``min(1, 2 min(p_upper, p_lower))`` (Bonferroni over the two tails), each tail's
    sequential p-value; None when ``null`` stopped before the lower tail's rule could (a test
    drawn one-sided, as every test saved before 2026-12 was)."""
    try:
        lower = sequential_p_value(-observed, -np.asarray(null, dtype=np.float64),
                                   max_draws=max_draws, stop_after=stop_after)
    except ValueError:
        return None
    upper = sequential_p_value(observed, null, max_draws=max_draws, stop_after=stop_after)
    return min(1.0, 2.0 * min(upper, lower))


def draws_made(observed: float, null: np.ndarray, *, max_draws: int,
               stop_after: int | None) -> int:
    """How many of the values in ``null`` the rule draws before it stops (``L``)."""
    check_rule(max_draws, stop_after)
    hits = np.cumsum(np.asarray(null, dtype=np.float64)[:max_draws] >= observed)
    if stop_after is not None and (reached := np.flatnonzero(hits >= stop_after)).size:
        return int(reached[0]) + 1
    if hits.size < max_draws:
        raise ValueError(f"{hits.size} null values: the rule needs {max_draws} or a stop")
    return max_draws


def sequential_p_value(observed: float, null: np.ndarray, *, max_draws: int,
                       stop_after: int | None) -> float:
    """Besag and Clifford's p-value of ``observed`` against the draws in ``null``.

    ``h / L`` when the ``h = stop_after``-th value ``>= observed`` is draw ``L <= max_draws``,
    else ``(g + 1) / (max_draws + 1)`` with ``g`` the exceedances in the ``max_draws`` draws
    (``stop_after=None``: always the latter, the fixed Monte Carlo test). Values of ``null``
    after the stop are ignored, so the fixed test's null gives its sequential p too.
    """
    n = draws_made(observed, null, max_draws=max_draws, stop_after=stop_after)
    g = int(np.sum(np.asarray(null[:n], dtype=np.float64) >= observed))
    if stop_after is not None and g == stop_after:
        return stop_after / n
    return (g + 1) / (max_draws + 1)
