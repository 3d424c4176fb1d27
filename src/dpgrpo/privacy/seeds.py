"""Debugging seeds: every generator's seed derived from the one user seed (``privacy.seed``).

A seeded run is reproducible and therefore never releasable (invariant 4); a secure run draws
every key from OS entropy and uses none of this. Each generator gets its own stream offset, so
no two generators of one run share a seed; ranks and protocol runs get strides of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, TypedDict

#: generator -> offset from the user seed (the record coins and the sampler derive their own
#: keys from the seed itself, under different SHA-256 / numpy constructions)
STREAMS = {"sampler": 0, "records": 0, "torch": 0, "noise": 1, "canaries": 3, "chooser": 4}
RANK_STRIDE = 7919  # a prime, so rank strides never meet the stream offsets
RUN_STRIDE = 16     # protocol run k (seed k) of an arm: privacy.seed + 16 (k - 1)


def derive_seed(seed: int | None, stream: str, rank: int = 0) -> int | None:
    """The debugging seed of generator ``stream`` on ``rank`` (None: a secure run)."""
    if seed is None:
        return None
    return seed + STREAMS[stream] + RANK_STRIDE * rank


def run_seed(seed: int | None, run: int) -> int | None:
    """The user seed of a protocol arm's run ``run`` (1, 2, ...): a stride apart, so the
    streams of two runs never coincide (None: secure runs)."""
    return None if seed is None else seed + RUN_STRIDE * (run - 1)


class GeneratorState(TypedDict, total=False):
    """A privacy generator's ``state_dict()``, saved in ``recovery/`` for a resumed run."""

    source: str                          # "os-entropy" (nothing to restore) or "seeded"
    seed: int | None                     # the debugging seed (seeded only)
    bit_generator: Mapping[str, object]  # numpy's generator state (seeded samplers, choosers)
    round: int                           # the noise's round index (seeded noise)


class SeededOrSecure:
    """A source of privacy randomness: OS entropy unless a debugging ``seed`` is set.

    ``secure`` without a seed; ``releasable`` only then (a seeded run's coins and noise can be
    recomputed, so the hidden-randomness assumption A3 fails). One definition for the noise,
    the record coins, the slot sampler and the contributor's problem chooser.
    """

    seed: int | None

    @property
    def secure(self) -> bool:
        """Whether the randomness comes from OS entropy (no debugging seed)."""
        return self.seed is None

    @property
    def releasable(self) -> bool:
        """Only secure randomness gives the hidden randomness assumption (A3) its meaning."""
        return self.secure


class RoundKeyed(SeededOrSecure):
    """A secure source that draws a fresh ``KEY_BITS``-bit key from the OS every round."""

    KEY_BITS: ClassVar[int]

    @property
    def secret_bits(self) -> int:
        """Secret bits behind one round's draws: the key (0 for a seeded source)."""
        return self.KEY_BITS if self.secure else 0


__all__ = [
    "RANK_STRIDE",
    "RUN_STRIDE",
    "STREAMS",
    "RoundKeyed",
    "SeededOrSecure",
    "derive_seed",
    "run_seed",
]
