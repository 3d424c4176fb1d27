"""Poisson sampling over n public slots (Algorithm 1, line 2).

Every round, each slot is present independently with probability q, including rounds in which no
slot is drawn (an empty batch still takes a noise-only step and is charged). The coins come from
the operating system's entropy pool (``os.urandom``) unless the user supplies a seed, which is for
debugging only: a seeded run is marked as not releasable (invariant 4), and its generator state is
kept in ``recovery/``, never in ``release/``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dpgrpo.errors import PrivacyBudgetError

_TWO_POW_53 = float(2**53)


class PoissonSampler:
    """Draws the sampled slot indices of one round.

    Args:
        n: number of public slots (a public constant, chosen without looking at the data).
        q: inclusion probability of each slot, usually m / n.
        seed: ``None`` (default) for OS entropy; an integer makes the run reproducible and
            therefore not releasable.
    """

    def __init__(self, n: int, q: float, *, seed: int | None = None) -> None:
        if n < 1:
            raise PrivacyBudgetError(f"n must be >= 1, got {n}")
        if not 0.0 <= q <= 1.0:
            raise PrivacyBudgetError(f"q must lie in [0, 1], got {q}")
        self.n, self.q, self.seed = n, q, seed
        self._rng = np.random.Generator(np.random.PCG64(seed)) if seed is not None else None

    @property
    def seeded(self) -> bool:
        return self._rng is not None

    @property
    def releasable(self) -> bool:
        """Only OS-entropy coins give the hidden randomness assumption (A3) its meaning."""
        return not self.seeded

    @property
    def expected_batch(self) -> float:
        """The public q * n by which the noisy sum is divided (never the realized size)."""
        return self.q * self.n

    def _uniforms(self) -> np.ndarray:
        if self._rng is not None:
            return self._rng.random(self.n)
        raw = np.frombuffer(os.urandom(8 * self.n), dtype=np.uint64)
        return (raw >> np.uint64(11)).astype(np.float64) / _TWO_POW_53  # 53-bit uniforms in [0, 1)

    def sample(self) -> np.ndarray:
        """Indices (sorted, int64) of the slots present this round; possibly empty."""
        return np.flatnonzero(self._uniforms() < self.q).astype(np.int64)

    def state_dict(self) -> dict[str, Any]:
        """Generator state for recovery files (empty for OS entropy: nothing to restore)."""
        if self._rng is None:
            return {"source": "os-entropy"}
        return {"source": "seeded", "seed": self.seed, "bit_generator": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("source") == "seeded":
            if self._rng is None:
                raise PrivacyBudgetError("cannot restore a seeded sampler state into an OS-entropy sampler")
            self._rng.bit_generator.state = state["bit_generator"]
