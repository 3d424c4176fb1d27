"""Gradient canaries for the white-box mechanism audit: fixed public directions in the
trainable space (Nasr et al., USENIX Security 2023; Andrew et al., ICLR 2024).

A gradient canary is a record whose per-record gradient is ``s * C * u``: a unit direction u
scaled beyond the clipping norm (s > 1), so that a correct mechanism clips it to exactly
``C * u``. The auditor knows every u (they are public, made from a public seed); only which
canaries were included is secret.

Directions. Andrew et al. draw i.i.d. Gaussian directions, nearly orthogonal in high dimension.
Here the K directions are K distinct rows of a randomized orthonormal transform of the
d-dimensional trainable space, ``Q = DCT-II (orthonormal) . diag(signs)`` with random signs and
randomly chosen rows. They are exactly orthonormal, so one canary's statistic is not disturbed
by the other canaries (no 1/sqrt(d) cross-talk), and they are dense: every direction spreads its
mass over all coordinates (about half on each half of the vector), so a mechanism that noises
only some coordinates shows in every canary. Scoring all K canaries against an update costs one
fast transform, ``<u_i, g> = (Q g)_{f_i}``, instead of K dot products. This needs d >= K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import fft

from dpgrpo.errors import ConfigError


@dataclass(frozen=True)
class CanaryDirections:
    """K orthonormal directions in R^d: row ``rows[i]`` of ``DCT-II . diag(signs)``.

    Public by construction (a function of ``(d, K, seed)`` only).
    """

    dimension: int
    rows: np.ndarray           # (K,) distinct DCT frequencies, one per canary
    signs: np.ndarray          # (d,) +-1

    @property
    def count(self) -> int:
        return int(self.rows.size)

    def project(self, vector: torch.Tensor | np.ndarray) -> np.ndarray:
        """``<u_i, vector>`` for every canary i, shape (K,), in fp64."""
        v = np.asarray(vector, dtype=np.float64).reshape(-1)
        if v.size != self.dimension:
            raise ConfigError(f"a vector of {v.size} coordinates projected on canaries in "
                              f"{self.dimension} dimensions")
        return fft.dct(v * self.signs, type=2, norm="ortho")[self.rows]

    def gradients(self, indices: np.ndarray | list[int]) -> torch.Tensor:
        """The unit directions of canaries ``indices`` as an (len, d) fp32 tensor, built on
        demand (K x d at once would take gigabytes at K ~ d ~ 20,000)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        eye = np.zeros((idx.size, self.dimension))
        eye[np.arange(idx.size), self.rows[idx]] = 1.0
        rows = fft.idct(eye, type=2, norm="ortho", axis=1) * self.signs
        return torch.from_numpy(rows).float()

    def matrix(self) -> np.ndarray:
        """The (K, d) matrix whose rows are the unit directions (fp64)."""
        eye = np.zeros((self.count, self.dimension))
        eye[np.arange(self.count), self.rows] = 1.0
        return fft.idct(eye, type=2, norm="ortho", axis=1) * self.signs


def make_directions(dimension: int, count: int, *, seed: int = 0) -> CanaryDirections:
    """K public directions in R^d from a public seed (distinct rows, random signs)."""
    if count < 1:
        raise ConfigError(f"need at least one gradient canary, got {count}")
    if dimension < count:
        raise ConfigError(f"{count} orthonormal canary directions need at least {count} "
                          f"trainable coordinates, got {dimension}")
    rng = np.random.default_rng(seed)
    rows = rng.choice(dimension, size=count, replace=False)
    signs = rng.choice(np.array([-1.0, 1.0]), size=dimension)
    return CanaryDirections(dimension, rows, signs)


__all__ = ["CanaryDirections", "make_directions"]
