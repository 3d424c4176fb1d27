"""The privacy core: Poisson sampling, the clip-and-noise mechanism, noise sources, accounting.

The accountant is one function family (issue 59), an event in and a number out:
:func:`epsilon` (``RoundEvent`` s or a ``PrivacyLedger`` and delta in, epsilon out, for one
prompt added or removed, swapped (``relation=REPLACE``) or a group of k (``group=k``)),
:func:`sigma` (a target epsilon in, sigma out; :func:`calibrate` with its evidence),
:func:`epsilon_report` (epsilon of (n, m, T, sigma) with the RDP cross-check) and
:func:`generic_conversion` (the same relations for a bare (epsilon, delta) pair). The names it
replaces (``compute_epsilon``, ``pld_epsilon``, ``rdp_epsilon``, ``replace_one``,
``group_privacy``, ``calibrate_sigma``, ...) still resolve, with a DeprecationWarning.

Names are imported lazily so that the accounting (numpy/scipy/dp_accounting only) loads without
torch, e.g. in the calibration worker process and the ``dpgrpo privacy`` commands.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_EXPORTS = {
    "accounting": ["ADD_OR_REMOVE", "REPLACE", "EpsilonReport", "PrivacyLedger", "RoundEvent",
                   "default_delta", "epsilon", "epsilon_report", "generic_conversion"],
    "calibration": ["Calibration", "calibrate", "sigma"],
    "mechanism": ["ClippedSum", "PrivatizedUpdate", "add_gaussian_noise", "clip_and_sum",
                  "clip_per_record", "clip_sum_count", "noise_and_scale",
                  "per_record_norms", "privatize", "sanitize_nonfinite"],
    "noise": ["NoiseSource"],
    "sampling": ["PoissonSampler"],
}
#: names this package exported before issue 59 -> (module, what replaces them)
_DEPRECATED = {
    "compute_epsilon": ("accounting", "epsilon_report"),
    "pld_epsilon": ("accounting", "epsilon"),
    "rdp_epsilon": ("accounting", "PrivacyLedger.rdp_epsilon or epsilon_report"),
    "replace_one": ("accounting", "generic_conversion(relation=REPLACE)"),
    "group_privacy": ("accounting", "generic_conversion(group=k)"),
    "calibrate_sigma": ("calibration", "sigma"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"dpgrpo.privacy.{_WHERE[name]}"), name)
    if name in _DEPRECATED:
        module, new = _DEPRECATED[name]
        warnings.warn(f"dpgrpo.privacy.{name} is deprecated; use dpgrpo.privacy.{new}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"dpgrpo.privacy.{module}"), name)
    raise AttributeError(f"module 'dpgrpo.privacy' has no attribute {name!r}")
