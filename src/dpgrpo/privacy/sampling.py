"""Poisson sampling over n public slots (Algorithm 1, line 2).

Every round, each slot is present independently with probability q, including rounds in which no
slot is drawn (an empty batch still takes a noise-only step and is charged). In *secure* mode (the
default) the coins come from the operating system's entropy pool (``os.urandom``); *seeded* mode,
for debugging only, draws them from the user's seed: a seeded run is marked as not releasable
(invariant 4), and its generator state is kept in ``recovery/``, never in ``release/``. The words
are the noise's (:class:`dpgrpo.privacy.noise.NoiseSource`).

The number of slots n is public (assumption A1): :func:`public_slot_count` fixes it from the
configuration, never from how many records turned out to be valid.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpgrpo.errors import ConfigError, PrivacyBudgetError
from dpgrpo.privacy.seeds import SeededOrSecure

if TYPE_CHECKING:
    from dpgrpo.privacy.seeds import GeneratorState

_TWO_POW_53 = float(2**53)

#: Where a run's n came from, as the certificate states it (key ``n_source``).
N_SOURCES = {
    "data.n_slots": "data.n_slots: the public number of slots set in the configuration",
    "data.limit": ("data.limit (+ canaries): a public capacity; the first `limit` valid records "
                   "of the split fill the slots, and slots left over are absent records"),
    "data.indices": ("data.indices (+ canaries): a public capacity; the split's valid problems "
                     "at these positions fill the slots"),
    "embedded task": ("the embedded task's size (+ canaries): generated from a public seed, "
                      "so the count is public by construction"),
    "source rows": ("the raw row count of the source file (+ canaries), invalid rows counted "
                    "as absent slots: public only when the file itself is published; set "
                    "data.n_slots (or data.limit) for private data"),
}


@dataclass(frozen=True)
class SlotCount:
    """The public n, which rule fixed it (a key of :data:`N_SOURCES`), and the records placed."""

    n: int
    source: str
    records: int


def public_slot_count(*, n_slots: int | None, limit: int | None, problems: int,
                      source_rows: int, canaries: int, embedded: bool) -> SlotCount:
    """n from public configuration alone, first rule that applies (assumption A1, Section VII-A).

    ``data.n_slots``; else ``data.limit`` + canaries (a capacity); else the embedded task's size
    + canaries; else the source's raw row count (valid or not) + canaries. ``problems`` is the
    number of valid problems placed (after the limit), ``source_rows`` counts invalid rows too.
    The count of *valid* records never sets n: with ``data.skip_invalid`` it depends on the data.
    """
    records = problems + canaries
    if n_slots is not None:
        n, source = n_slots, "data.n_slots"
    elif limit is not None:
        n, source = limit + canaries, "data.limit"
    else:
        n, source = source_rows + canaries, "embedded task" if embedded else "source rows"
    if n < records:
        raise ConfigError(f"{source} = {n} is smaller than the {records} records "
                          f"(problems + canaries)")
    return SlotCount(n, source, records)


def read_entropy(nbytes: int) -> bytes:
    """The operating system's cryptographic source (one call per round in secure mode)."""
    return os.urandom(nbytes)


class PoissonSampler(SeededOrSecure):
    """Draws the sampled slot indices of one round.

    Args:
        n: number of public slots (a public constant, chosen without looking at the data).
        q: inclusion probability of each slot, usually m / n.
        seed: ``None`` (default) for secure mode (OS-entropy coins); an integer for seeded mode,
            which makes the run reproducible and therefore not releasable.
        entropy: the coin source in secure mode (default :func:`read_entropy`); tests pass
            a recorder.
    """

    def __init__(self, n: int, q: float, *, seed: int | None = None,
                 entropy: Callable[[int], bytes] | None = None) -> None:
        if n < 1:
            raise PrivacyBudgetError(f"n must be >= 1, got {n}")
        if not 0.0 <= q <= 1.0:
            raise PrivacyBudgetError(f"q must lie in [0, 1], got {q}")
        self.n, self.q, self.seed = n, q, seed
        self._entropy = entropy
        self._rng = np.random.Generator(np.random.PCG64(seed)) if seed is not None else None

    @property
    def expected_batch(self) -> float:
        """The public q * n by which the noisy sum is divided (never the realized size)."""
        return self.q * self.n

    def _uniforms(self) -> np.ndarray:
        if self._rng is not None:
            return self._rng.random(self.n)
        raw = np.frombuffer((self._entropy or read_entropy)(8 * self.n), dtype="<u8")
        return (raw >> np.uint64(11)).astype(np.float64) / _TWO_POW_53  # 53-bit uniforms in [0, 1)

    def sample(self) -> np.ndarray:
        """Indices (sorted, int64) of the slots present this round; possibly empty."""
        return np.flatnonzero(self._uniforms() < self.q).astype(np.int64)

    def state_dict(self) -> GeneratorState:
        """Generator state for recovery files (secure mode: nothing to restore)."""
        if self._rng is None:
            return {"source": "os-entropy"}
        return {
            "source": "seeded",
            "seed": self.seed,
            "bit_generator": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: GeneratorState) -> None:
        if state.get("source") == "seeded":
            if self._rng is None:
                raise PrivacyBudgetError(
                    "cannot restore a seeded sampler state into a secure sampler"
                )
            self._rng.bit_generator.state = state["bit_generator"]


class FixedSizeSampler(PoissonSampler):
    """Exactly ``round(q * n)`` distinct slots a round, uniformly at random: TRL's batch of a
    fixed number of prompts. **Non-private arms only**: the accountant's bound is for Poisson
    sampling, and a fixed-size batch is not covered by it (``train.batch_sampling = "fixed"``
    under a private arm is refused at load, :class:`dpgrpo.errors.PrivacyBudgetError`). The
    coins are the same as Poisson's (OS entropy, or the debugging seed): the slots with the
    ``m`` smallest uniforms.
    """

    @property
    def batch_size(self) -> int:
        """The fixed number of slots a round: ``round(q * n)``, at least 1, at most n."""
        return min(self.n, max(1, round(self.q * self.n)))

    def sample(self) -> np.ndarray:
        """Indices (sorted, int64) of the ``batch_size`` slots drawn this round."""
        chosen = np.argsort(self._uniforms(), kind="stable")[: self.batch_size]
        return np.sort(chosen).astype(np.int64)


#: ``train.batch_sampling`` -> its sampler (``fixed``: non-private arms only)
SAMPLERS: dict[str, type[PoissonSampler]] = {"poisson": PoissonSampler,
                                              "fixed": FixedSizeSampler}
