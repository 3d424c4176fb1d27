"""Sources of Gaussian noise for the mechanism (Algorithm 1, line 8).

Two modes:

* ``secure`` (default, and required for a releasable run): the generator is reseeded from
  ``os.urandom`` (the operating system's cryptographic source) on every round, so no generator
  state links rounds and nothing needs to be stored to resume.
* ``seeded``: one generator seeded by the user, for debugging and reproducible experiments. Its
  state is saved in ``recovery/`` so a resumed run continues the same stream. Such a run is not
  releasable.

Floating-point limits (the paper's assumption A4). The proof treats the noise as an exact draw
from N(0, sigma^2 C^2 I) over the reals. Here it is produced by PyTorch's normal sampler in
binary floating point (fp32 for fp32 updates, fp64 when the gradients are fp64): each sample is a
transformed pseudo-random integer, so the set of reachable values is finite and unevenly spaced,
and the 64-bit seed of each round's generator is the secret. Mironov (CCS 2012) showed that such
artefacts in the low-order bits can, in principle, reveal the un-noised value for a Laplace
mechanism; Jin et al. (S&P 2022) extended floating-point and timing attacks to Gaussian samplers.
dpgrpo does not implement a discrete or snapping Gaussian, so the certificate covers the
mechanism over the reals, not its finite-precision execution. Adding the noise to a sum of
clipped gradients that is itself rounded, and dividing by q*n afterwards, does not remove this
gap; it is stated in every certificate as assumption A4.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dpgrpo.errors import PrivacyError


class NoiseSource:
    """Draws N(0, std^2) tensors for the mechanism; see the module docstring for the modes."""

    def __init__(self, *, seed: int | None = None, device: str | torch.device = "cpu") -> None:
        self.seed = seed
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)

    @property
    def secure(self) -> bool:
        return self.seed is None

    @property
    def releasable(self) -> bool:
        return self.secure

    def start_round(self) -> None:
        """Called once per round; in secure mode, reseeds from the OS's cryptographic source."""
        if self.secure:
            self._generator.manual_seed(int.from_bytes(os.urandom(8), "little"))

    def normal(self, shape: torch.Size | tuple[int, ...], std: float, dtype: torch.dtype) -> torch.Tensor:
        """A tensor of i.i.d. N(0, std^2) entries (std may be 0: returns zeros)."""
        if not std >= 0.0:
            raise PrivacyError(f"noise standard deviation must be >= 0, got {std}")
        if dtype not in (torch.float32, torch.float64):
            raise PrivacyError(f"noise is drawn in fp32 or fp64, not {dtype}")
        out = torch.empty(shape, dtype=dtype, device=self.device)
        if std == 0.0:
            return out.zero_()
        return out.normal_(0.0, std, generator=self._generator)

    def state_dict(self) -> dict[str, Any]:
        """Generator state for recovery files; empty in secure mode (nothing to restore)."""
        if self.secure:
            return {"source": "os-entropy"}
        return {"source": "seeded", "seed": self.seed, "state": self._generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("source") == "seeded":
            if self.secure:
                raise PrivacyError("cannot restore a seeded noise state into a secure noise source")
            self._generator.set_state(state["state"])
