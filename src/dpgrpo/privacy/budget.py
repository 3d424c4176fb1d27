"""A run's public constants from its configuration alone (assumption A1): q, delta, sigma, C.

The one resolver behind the trainer (:func:`dpgrpo.training.setup.build_run`) and the budget
report (:mod:`dpgrpo.reports.budget`, Table VI), so that the epsilon a report promises is the
one a run certifies. Both first count the n public slots with
:func:`dpgrpo.tasks.splits.public_slots` (it reads the split: the task layer, above this one),
then :func:`public_constants` gives q = m / n, delta = ``privacy.delta`` or 1/(10 n), sigma
(``privacy.noise_multiplier``, else calibrated from ``privacy.epsilon``; 0 for the non-private
arm) and the clipping norm C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from dpgrpo.config import RunConfig
from dpgrpo.errors import ConfigError, PrivacyBudgetError
from dpgrpo.privacy.accounting import default_delta, sampling_rate


@dataclass(frozen=True)
class PublicConstants:
    """The mechanism's public parameters for n slots (Algorithm 1, lines 1-2)."""

    n: int
    expected_batch: float       # m = q n
    q: float
    delta: float
    sigma: float                # 0 for the non-private arm
    clip_norm: float            # inf for the non-private arm unless train.clip_nonprivate
    rounds: int
    sigma_calibrated: bool      # True: sigma came from privacy.epsilon by calibration


def public_constants(config: RunConfig, n: int, *, refuse_weak_delta: bool = False,
                     cache: dict[tuple[object, ...], Any] | None = None) -> PublicConstants:
    """n, m, q, delta, sigma and C of a run of ``config`` over ``n`` public slots.

    ``refuse_weak_delta`` (the trainer): a private unseeded run needs delta < 1/n
    (PrivacyBudgetError), checked before any calibration. ``cache`` shares calibrations
    between configurations with the same (n, m, T, epsilon, delta). An unreachable
    ``privacy.epsilon`` or an expected batch above n raises ConfigError.
    """
    p, rounds = config.privacy, config.train.rounds
    if p.expected_batch > n:
        raise ConfigError(f"privacy.expected_batch = {p.expected_batch:g} exceeds n = {n} slots")
    q = sampling_rate(n, p.expected_batch)
    delta = p.delta if p.delta is not None else default_delta(n)
    if refuse_weak_delta and config.private and p.seed is None and not delta < 1.0 / n:
        raise PrivacyBudgetError(
            f"privacy.delta = {delta:.3g} is at least 1/n = {1.0 / n:.3g}: a mechanism that "
            "publishes one random record whole meets such a delta; a releasable run needs "
            "delta < 1/n (default 1/(10 n))")
    calibrated = config.private and p.noise_multiplier is None
    if not config.private:
        sigma = 0.0
        clip = p.clip_norm if config.train.clip_nonprivate else math.inf
    elif not calibrated:
        # private and not calibrated: noise_multiplier is set
        sigma, clip = cast(float, p.noise_multiplier), p.clip_norm
    else:
        sigma = _calibrated_sigma(n, p.expected_batch, rounds, p.epsilon, delta, cache)
        clip = p.clip_norm
    return PublicConstants(n=n, expected_batch=p.expected_batch, q=q, delta=delta, sigma=sigma,
                           clip_norm=clip, rounds=rounds, sigma_calibrated=calibrated)


def _calibrated_sigma(n: int, m: float, rounds: int, epsilon: float, delta: float,
                      cache: dict[tuple[object, ...], Any] | None) -> float:
    """The smallest sigma whose PLD epsilon meets ``epsilon`` (privacy.calibration)."""
    from dpgrpo.privacy import calibration

    cache = {} if cache is None else cache
    key = ("calibrate", n, m, rounds, epsilon, delta)
    try:
        if key not in cache:
            cache[key] = calibration.calibrate(n, m, rounds, epsilon, delta)
    except PrivacyBudgetError as err:
        raise ConfigError(f"privacy.epsilon = {epsilon} is unreachable with n = {n}, "
                          f"m = {m}, T = {rounds}: {err}") from None
    return float(cache[key].sigma)


__all__ = ["PublicConstants", "public_constants"]
