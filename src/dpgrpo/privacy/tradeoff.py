"""What a certificate allows a membership attacker: the trade-off curve and its AUC ceiling.

A mechanism that is (eps, delta(eps))-DP for every eps (its privacy profile, here the PLD of the
ledger's rounds) bounds every test of "this record was in the training set" against "it was
not": at false-positive rate ``alpha`` the true-positive rate is at most ``1 - f(alpha)`` with

    f(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha, e^-eps (1 - delta(eps) - alpha))

(Kairouz, Oh and Viswanath 2015; Dong, Roth and Su, "Gaussian differential privacy", 2022,
Proposition 2.12 for one pair and the supremum over a profile). The area under ``1 - f`` bounds
the AUC of any attack on one record, and, since ``1 - f`` is concave, also the pooled ROC of an
attack run over many records in the game where each record is in with probability 1/2 (Jensen).
An audit that compares fixed members with other records (:mod:`dpgrpo.audit.mia`) is not that
game exactly: a difference between the two sets that training did not cause is not bounded.

Numerics, each on the side that keeps the ceiling an upper bound: the profile comes from the
pessimistic PLD of :func:`dpgrpo.privacy.group.composed_pld`; the supremum runs over a finite
grid of eps (fewer constraints: a larger ``1 - f``); the integral is a right Riemann sum of the
non-decreasing ``1 - f`` (at most ``1 / alphas`` above the exact area).

For mu-Gaussian DP (one Gaussian mechanism without subsampling, T rounds: mu = sqrt(T) / sigma)
the exact curve is ``Phi(Phi^-1(alpha) + mu)`` and its area ``Phi(mu / sqrt 2)``
(:func:`gaussian_auc`), which the tests use as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from dpgrpo.privacy.accounting import DEFAULT_DISCRETIZATION, RoundEvent, private_rounds
from dpgrpo.privacy.group import ADD_OR_REMOVE, composed_pld

#: delta below which the profile is treated as zero when choosing the eps grid's upper end.
NEGLIGIBLE_DELTA = 1e-12


def gaussian_auc(mu: float) -> float:
    """The AUC of the trade-off curve of mu-Gaussian DP: ``Phi(mu / sqrt(2))``."""
    if mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu}")
    return NormalDist().cdf(mu / math.sqrt(2.0))


def tradeoff_curve(events: Sequence[RoundEvent], *, alphas: int = 2001, epsilons: int = 2001,
                   value_discretization_interval: float = DEFAULT_DISCRETIZATION
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(alpha, tpr)``: the largest true-positive rate any membership test of one record can
    have at each false-positive rate, under the composed rounds of ``events``.

    A non-private round (sigma = 0 on sampled data) allows everything: ``tpr = 1`` for
    ``alpha > 0``. No private round: ``tpr = alpha`` (no test beats a coin).
    """
    if alphas < 2 or epsilons < 2:
        raise ValueError("need at least 2 grid points for alpha and for eps")
    alpha = np.linspace(0.0, 1.0, alphas)
    rounds = private_rounds(events)
    if rounds is None:
        return alpha, np.where(alpha > 0, 1.0, 0.0)
    if not rounds:
        return alpha, alpha.copy()
    pld = composed_pld(rounds, 1, ADD_OR_REMOVE, value_discretization_interval)
    top = max(float(pld.get_epsilon_for_delta(NEGLIGIBLE_DELTA)), 1e-6)
    eps = np.linspace(0.0, top, epsilons)
    delta = np.asarray(pld.get_delta_for_epsilon(eps), dtype=np.float64)     # (E,)
    a = alpha[:, None]                                                        # (A, 1)
    slack = 1.0 - delta[None, :]
    f = np.maximum(slack - np.exp(eps)[None, :] * a, np.exp(-eps)[None, :] * (slack - a))
    f = np.clip(f.max(axis=1), 0.0, 1.0)
    return alpha, np.clip(1.0 - f, alpha, 1.0)     # no test is worse than a coin's diagonal


def auc_ceiling(events: Sequence[RoundEvent], *, alphas: int = 2001, epsilons: int = 2001,
                value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> float:
    """An upper bound on the membership-inference AUC that the rounds of ``events`` allow."""
    alpha, tpr = tradeoff_curve(events, alphas=alphas, epsilons=epsilons,
                                value_discretization_interval=value_discretization_interval)
    return float(min(1.0, np.sum(np.diff(alpha) * tpr[1:])))    # right sum of a rising curve


__all__ = ["NEGLIGIBLE_DELTA", "auc_ceiling", "gaussian_auc", "tradeoff_curve"]
