"""The smallest noise multiplier the PLD accountant can evaluate (min_sigma and its check).

The values and the check live in :mod:`dpgrpo.config.sigma_floor`, below this layer, because
the config refuses such a sigma at load; they are re-exported here for the accountant, the
calibration and ``dpgrpo privacy``.
"""

from __future__ import annotations

from dpgrpo.config.sigma_floor import (
    DISCRETIZATION,
    MAX_PLD_POINTS,
    check_accountable_sigma,
    min_sigma,
    pld_grid_points,
)

__all__ = ["DISCRETIZATION", "MAX_PLD_POINTS", "check_accountable_sigma", "min_sigma",
           "pld_grid_points"]
