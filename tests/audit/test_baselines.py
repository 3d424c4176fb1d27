"""LOSS, zlib, Min-K% and entropy baselines, raw and base-calibrated."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from dpgrpo.audit.baselines import TokenStats, baseline_scores, min_k_score

LP = np.log(np.array([[0.5, 0.1, 0.9, 0.2, 0.3], [0.5, 0.5, 0.0 + 1, 1.0, 1.0]]))
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
ENT = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [0.5, 1.5, 9.0, 9.0, 9.0]])
TEXTS = ("x = 12", "7")


def test_min_k_takes_the_least_likely_fifth():
    # 5 tokens, k = 20%: one token, the least likely (0.1); 2 tokens: ceil(0.4) = 1
    s = min_k_score(LP, MASK, 0.2)
    assert s == pytest.approx([math.log(0.1), math.log(0.5)])
    assert min_k_score(LP, MASK, 0.4)[0] == pytest.approx(0.5 * (math.log(0.1) + math.log(0.2)))


def test_raw_and_calibrated_by_hand():
    ft = TokenStats(LP, ENT, MASK)
    base = TokenStats(LP - 1.0, ENT + 0.5, MASK)          # base: each token e times less likely
    s = baseline_scores(ft, base, TEXTS)
    total = np.log([0.5 * 0.1 * 0.9 * 0.2 * 0.3, 0.25])
    assert s["loss"] == pytest.approx(total)
    assert s["loss_calibrated"] == pytest.approx([5.0, 2.0])  # one nat per scored token
    z = np.array([len(zlib.compress(t.encode())) for t in TEXTS])
    assert s["zlib"] == pytest.approx(total / z)
    assert s["zlib_calibrated"] == pytest.approx(np.array([5.0, 2.0]) / z)
    assert s["min_k_calibrated"] == pytest.approx([1.0, 1.0])
    assert s["entropy"] == pytest.approx([-3.0, -1.0])
    assert s["entropy_calibrated"] == pytest.approx([0.5, 0.5])
    assert set(s) == {f"{n}{c}" for n in ("loss", "zlib", "min_k", "entropy")
                      for c in ("", "_calibrated")}
