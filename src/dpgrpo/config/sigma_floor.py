"""The smallest noise multiplier the PLD accountant can evaluate, checked before it is tried.

``dp_accounting`` discretizes one Poisson-subsampled Gaussian round's privacy loss on a grid of
step ``value_discretization_interval`` (1e-4) over the loss range it keeps (about ten standard
deviations each side, log-mass truncation e^-50), i.e. roughly ``(1 + 20 sigma) / (2 sigma^2
1e-4)`` points. At sigma = 1e-3 that is ~5e9 float64 points (tens of GiB), at sigma = 0.01 ~6e7
points and minutes of FFT composition: the accountant cannot certify such a sigma on a normal
machine, so the value is refused with that reason instead of being tried. Dependency-free, so
the config can check it without importing the accountant.

It lives in config/ (the layer below privacy/) because :class:`~dpgrpo.config.PrivacyConfig`
checks ``privacy.noise_multiplier`` against it at load; :mod:`dpgrpo.privacy.limits` re-exports
every name for the accountant and the calibration.
"""

from __future__ import annotations

from dpgrpo.errors import PrivacyBudgetError

#: most grid points of one round's privacy-loss distribution we let the accountant build
#: (2^22 float64 values = 32 MiB per copy; composition needs several copies and FFTs)
MAX_PLD_POINTS = 2 ** 22
DISCRETIZATION = 1e-4  # dp_accounting's default value_discretization_interval


def pld_grid_points(sigma: float, discretization: float = DISCRETIZATION) -> float:
    """Approximate number of grid points of one round's PLD at noise multiplier ``sigma``."""
    return (1.0 + 20.0 * sigma) / (2.0 * sigma * sigma * discretization)


def min_sigma(discretization: float = DISCRETIZATION) -> float:
    """The smallest sigma whose one-round PLD fits in :data:`MAX_PLD_POINTS` (bisection)."""
    lo, hi = 1e-6, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pld_grid_points(mid, discretization) > MAX_PLD_POINTS else (lo, mid)
    return hi


def check_accountable_sigma(sigma: float, name: str = "sigma") -> None:
    """Refuse a sigma below :func:`min_sigma` (PrivacyBudgetError naming ``name``, with why)."""
    floor = min_sigma()
    if 0 < sigma < floor:
        raise PrivacyBudgetError(
            f"{name} = {sigma:g} is below {floor:.3g}, the smallest noise multiplier the PLD "
            f"accountant can evaluate: its privacy-loss grid would hold about "
            f"{pld_grid_points(sigma):.2g} points (memory and time beyond any machine's), so no "
            "epsilon can be certified; use a larger sigma")
