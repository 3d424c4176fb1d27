"""Besag and Clifford's sequential Monte Carlo p-value, with cheap statistics (no model)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dpgrpo.audit.sequential import (
    DEFAULT_STOP_AFTER,
    check_rule,
    draw_sequentially,
    draws_made,
    front_end_rule,
    sequential_p_value,
)

N, H = 50, DEFAULT_STOP_AFTER          # the study's rule: at most 50 draws, stop at 10


def _mean_gap(x: np.ndarray, y: np.ndarray) -> float:
    return float(x[y == 1].mean() - x[y == 0].mean())


def _shuffles(x: np.ndarray, y: np.ndarray, rng: np.random.Generator,
              counter: list[int]) -> Iterator[float]:
    while True:
        counter[0] += 1
        yield _mean_gap(x, rng.permutation(y))


def _test(observed: float, nulls: Iterator[float], stop_after: int | None = H,
          max_draws: int = N) -> tuple[float, np.ndarray]:
    null = draw_sequentially(observed, nulls, max_draws=max_draws, stop_after=stop_after)
    return sequential_p_value(observed, null, max_draws=max_draws, stop_after=stop_after), null


def _margin(alpha: float, runs: int) -> float:
    return 3 * np.sqrt(alpha * (1 - alpha) / runs)


def test_valid_under_the_null_over_simulated_datasets():
    """2,000 datasets without signal (20 normals, labels 10/10), each a sequential permutation
    test of the mean gap: P(p <= alpha) <= alpha up to a 3-sigma binomial margin, and at
    p = h / n (attainable both ways) the rate is alpha itself, so the test is not conservative."""
    rng, runs = np.random.default_rng(0), 2000
    y = np.repeat([1, 0], 10)
    p = np.empty(runs)
    for i in range(runs):
        x, counter = rng.normal(size=20), [0]
        p[i], null = _test(_mean_gap(x, y), _shuffles(x, y, rng, counter))
        assert counter[0] == null.size                    # no draw past the stop
    for alpha in (0.001, 0.01, 0.05, 0.2):
        assert np.mean(p <= alpha) <= alpha + _margin(alpha, runs), alpha
    assert p.min() == pytest.approx(1 / (N + 1))
    assert abs(np.mean(p <= H / N) - H / N) <= _margin(H / N, runs)
    assert abs(np.mean(p <= 0.5) - 0.5) <= _margin(0.5, runs) + 0.02


def test_strong_signal_draws_all_and_gives_the_fixed_tests_smallest_p():
    counter = [0]
    x, y = np.r_[np.full(10, 5.0), np.zeros(10)], np.repeat([1, 0], 10)
    p, null = _test(_mean_gap(x, y), _shuffles(x, y, np.random.default_rng(1), counter))
    assert (null.size, counter[0], p) == (N, N, 1 / (N + 1))


def test_no_signal_stops_after_about_h_over_the_exceedance_rate():
    """Uniform nulls against 0.1: each draw exceeds with probability 0.9, so the test stops
    after h / 0.9 draws on average (negative binomial), and p = h / L exactly."""
    rng, draws, runs = np.random.default_rng(2), [], 2000
    for _ in range(runs):
        p, null = _test(0.1, iter(rng.uniform(size=N)))
        assert p == H / null.size and np.sum(null >= 0.1) == H and null[-1] >= 0.1
        draws.append(null.size)
    sd = np.sqrt(H * 0.1 / 0.9**2 / runs)                  # of the mean of L
    assert abs(np.mean(draws) - H / 0.9) < 4 * sd
    p, null = _test(-np.inf, iter(rng.uniform(size=N)))    # every draw exceeds
    assert (null.size, p) == (H, 1.0)


def test_the_fixed_test_and_the_prefix():
    """stop_after=None is the fixed test; the sequential rule on the fixed test's draws gives
    the sequential test's p and stopping point, which are its first L draws."""
    rng = np.random.default_rng(3)
    null = rng.normal(size=N)
    for observed in (-0.5, 0.0, 1.0, 3.0):
        p, drawn = _test(observed, iter(null), stop_after=None)
        assert np.array_equal(drawn, null)
        assert p == (1 + np.sum(null >= observed)) / (1 + N)
        p_seq, seq = _test(observed, iter(null))
        assert np.array_equal(seq, null[:seq.size])
        assert p_seq == sequential_p_value(observed, null, max_draws=N, stop_after=H)
        assert seq.size == draws_made(observed, null, max_draws=N, stop_after=H)
        if seq.size == N and np.sum(null >= observed) < H:
            assert p_seq == p                               # small p: the fixed test's


def test_stopping_at_the_last_draw_and_h_equal_to_n():
    null = np.r_[np.zeros(N - 1), 1.0]                      # one exceedance, at the end
    assert sequential_p_value(0.5, null, max_draws=N, stop_after=1) == 1 / N
    assert sequential_p_value(0.5, null, max_draws=N, stop_after=2) == 2 / (N + 1)
    everything = np.ones(N)                                 # h = n is the fixed test
    assert sequential_p_value(0.5, everything, max_draws=N, stop_after=N) == 1.0 == \
        sequential_p_value(0.5, everything, max_draws=N, stop_after=None)


def test_the_rule_is_checked():
    for n, h in ((0, None), (5, 0), (5, 6), (5, -1)):
        with pytest.raises(ValueError, match="permutations"):
            check_rule(n, h)
    with pytest.raises(ValueError, match="ran out after 3 of 5"):
        draw_sequentially(9.0, iter([0.0, 1.0, 2.0]), max_draws=5, stop_after=2)
    with pytest.raises(ValueError, match="3 null values"):
        sequential_p_value(9.0, np.zeros(3), max_draws=5, stop_after=2)
    assert [front_end_rule(50, h) for h in (None, 0, 1, 10, 49, 50, 99)] == \
        [None, None, 1, 10, 49, None, None]
    assert front_end_rule(0, 10) is None
    with pytest.raises(ValueError, match=">= 0"):
        front_end_rule(50, -1)
