"""The privacy core: Poisson sampling, the clip-and-noise mechanism, noise sources, accounting.

Names are imported lazily so that the accounting (numpy/scipy/dp_accounting only) loads without
torch, e.g. in the calibration worker process and the ``dpgrpo privacy`` commands.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "accounting": ["EpsilonReport", "PrivacyLedger", "RoundEvent", "compute_epsilon",
                   "default_delta", "group_privacy", "pld_epsilon", "rdp_epsilon", "replace_one"],
    "calibration": ["Calibration", "calibrate", "calibrate_sigma"],
    "mechanism": ["ClippedSum", "PrivatizedUpdate", "add_gaussian_noise", "clip_and_sum",
                  "clip_per_record", "clip_sum_count", "noise_and_scale",
                  "per_record_norms", "privatize", "sanitize_nonfinite"],
    "noise": ["NoiseSource"],
    "sampling": ["PoissonSampler"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"dpgrpo.privacy.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dpgrpo.privacy' has no attribute {name!r}")
