"""The privacy core: Poisson sampling, the clip-and-noise mechanism, noise sources, accounting."""

from dpgrpo.privacy.accounting import (
    Calibration,
    EpsilonReport,
    PrivacyLedger,
    RoundEvent,
    calibrate,
    calibrate_sigma,
    compute_epsilon,
    default_delta,
    group_privacy,
    pld_epsilon,
    rdp_epsilon,
    replace_one,
)
from dpgrpo.privacy.mechanism import (
    PrivatizedUpdate,
    add_gaussian_noise,
    clip_and_sum,
    clip_per_record,
    per_record_norms,
    privatize,
    sanitize_nonfinite,
)
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.privacy.sampling import PoissonSampler

__all__ = [
    "Calibration", "EpsilonReport", "PrivacyLedger", "RoundEvent", "calibrate", "calibrate_sigma",
    "compute_epsilon", "default_delta", "group_privacy", "pld_epsilon", "rdp_epsilon",
    "replace_one", "PrivatizedUpdate", "add_gaussian_noise", "clip_and_sum", "clip_per_record",
    "per_record_norms", "privatize", "sanitize_nonfinite", "NoiseSource", "PoissonSampler",
]
