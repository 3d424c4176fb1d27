"""DIBA features from arrays: k3, likelihood ratio, zlib normalization, rewards."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from dpgrpo.audit.features import (
    DIBA_FEATURES,
    SampleScores,
    diba_features,
    feature_matrix,
    k3_divergence,
    sequence_log_ratio,
    zlib_length,
)

L2 = math.log(2.0)


def test_k3_by_hand_ignores_padding():
    # pi_ft = 1/2, pi_ref = 1/4 on every real token: r = 1/2, k3 = 1/2 + log 2 - 1
    lf = np.array([[math.log(0.5), math.log(0.5), 99.0], [math.log(0.5), -7.0, -7.0]])
    lb = np.array([[math.log(0.25), math.log(0.25), -3.0], [math.log(0.25), 5.0, 5.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    k3 = k3_divergence(lf, lb, mask)
    assert k3 == pytest.approx([0.5 + L2 - 1.0] * 2)
    assert sequence_log_ratio(lf, lb, mask) == pytest.approx([2 * L2, L2])


def test_k3_zero_when_models_agree_and_nan_when_empty():
    lp = torch.log(torch.tensor([[0.3, 0.6], [0.2, 0.9]]))
    k3 = k3_divergence(lp, lp, torch.tensor([[True, True], [False, False]]))
    assert k3[0] == 0.0 and np.isnan(k3[1])


def test_k3_nonnegative_random():
    rng = np.random.default_rng(0)
    lf, lb = np.log(rng.uniform(0.01, 1, (5, 7))), np.log(rng.uniform(0.01, 1, (5, 7)))
    assert (k3_divergence(lf, lb, np.ones((5, 7), bool)) > 0).all()


def test_diba_features_by_hand():
    texts = ("The answer is 4.", "4")
    lf = np.array([[math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0]])
    lb = np.array([[math.log(0.25), math.log(0.25)], [math.log(0.25), 0.0]])
    mask = np.array([[1, 1], [1, 0]], bool)
    feats = diba_features([1, 1, 0, 1], [0, 0, 1, 0], SampleScores(lf, lb, mask, texts))
    assert feats["ft_score"] == 0.75 and feats["base_score"] == 0.25
    assert feats["score_gain"] == 0.5
    assert feats["k3_divergence"] == pytest.approx(0.5 + L2 - 1.0)
    assert feats["likelihood_ratio"] == pytest.approx(1.5 * L2)
    z = [len(zlib.compress(t.encode())) for t in texts]
    assert feats["zlib_likelihood_ratio"] == pytest.approx(0.5 * (2 * L2 / z[0] + L2 / z[1]))
    x = feature_matrix([feats, feats])
    assert x.shape == (2, len(DIBA_FEATURES)) and x[1, 2] == 0.5


def test_zlib_length_and_shape_errors():
    assert zlib_length("") == 8
    assert zlib_length("ab" * 100) < zlib_length("".join(chr(97 + i % 26) for i in range(200)))
    with pytest.raises(ValueError):
        SampleScores(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3)), ("a",))
