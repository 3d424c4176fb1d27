"""Each record's own randomness, bound to (round, slot): rollout coins, dropout masks, shuffles.

Why. The sensitivity bound (one record moves the clipped sum by at most C, assumptions A2/A3)
needs every *other* record's contribution to stay exactly what it was when one record is
added or removed. A record's contribution is a function of its data **and of its randomness**:
its rollout coins, its LoRA-dropout masks, the shuffle of the shuffled-reward control, and (at
contributor level) which k problems it brings. If that randomness is handed out in order from
one stream (the n-th seed of a generator, the global generator's next mask), adding one record
first in a round changes every later record's coins, and the clipped sum moves by up to
(batch size) * C. So here every record's randomness is a pure function of the round's key and
of the record's public slot index: whatever its batch-mates, its position or its rank, a
record sees exactly the same coins.

How.

1. **Round key.** :meth:`RecordRandomness.round_key` gives round t a fresh 256-bit key from
   ``os.urandom`` (secure mode), or SHA-256 of the debugging seed and t (seeded mode: fully
   reproducible, never releasable, nothing to store since the key is a function of t).
   It is independent of the Poisson coins and of the noise key (separate reads).
2. **Record streams.** :meth:`RoundKey.stream` is the ChaCha20 keystream (RFC 8439, OpenSSL via
   ``cryptography``) under the round key with nonce (purpose, part, slot): one independent
   stream per slot, per prompt of a contributor (part) and per use (rollout, dropout, shuffle,
   choose). ChaCha20 is a PRF of the key: streams under distinct nonces are computationally
   independent, and seeing any of them reveals nothing about the key or about the others.
3. **Uses.** Rollout coins are read straight from the stream (a 256-bit per-prompt *seed*,
   :meth:`RoundKey.seed`, that :func:`dpgrpo.rollout.sampling.row_coins` expands by ChaCha20
   again into 53-bit uniforms). Dropout masks come from a ``torch.Generator`` on the model's
   device, seeded per prompt with a 64-bit PRF output (:func:`torch_seed`): masks are far too
   large to draw on the CPU from a keystream. CUDA's Philox keeps all 64 bits; torch's CPU
   generator keeps 32, so on the CPU one record's masks can be found by 2^32 guesses. That
   costs no privacy the analysis relies on: the bound needs the binding (other records'
   masks unchanged), not the masks' secrecy, and a guessed 64- or 32-bit output of the PRF
   says nothing about the 256-bit round key or any other record's stream (that is what a PRF
   is), so the round's other randomness keeps its 256 secret bits.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpgrpo.errors import PrivacyError
from dpgrpo.privacy.seeds import RoundKeyed

if TYPE_CHECKING:
    from dpgrpo.privacy.seeds import GeneratorState

KEY_BYTES = 32                       # 256-bit round key
SEED_BYTES = 32                      # a prompt's rollout seed: 256 bits of its stream
#: what a record's stream is used for; each has its own nonce byte
PURPOSES = {"rollout": 1, "dropout": 2, "shuffle": 3, "choose": 4}
MAX_PART = (1 << 24) - 1             # prompts per record (3 nonce bytes)
MAX_SLOT = (1 << 64) - 1             # slot index (8 nonce bytes)
GENERATOR = (f"ChaCha20 (cryptography/OpenSSL) under a fresh {8 * KEY_BYTES}-bit key from "
             "os.urandom every round, one stream per (purpose, prompt of the record, slot)")


def read_entropy(nbytes: int) -> bytes:
    """The operating system's cryptographic source (one call per round in secure mode)."""
    return os.urandom(nbytes)


def _nonce(slot: int, part: int, purpose: str) -> bytes:
    """ChaCha20's 16-byte nonce in ``cryptography``: a zero block counter (4 bytes), then the
    purpose (1), the part (3) and the slot (8), so no two (slot, part, purpose) share one."""
    if purpose not in PURPOSES:
        raise PrivacyError(f"unknown use of a record's randomness {purpose!r}; one of "
                           f"{sorted(PURPOSES)}")
    if not (0 <= slot <= MAX_SLOT and 0 <= part <= MAX_PART):
        raise PrivacyError(f"slot {slot} or part {part} outside the nonce's range: two records "
                           "would share a stream")
    return (bytes(4) + bytes([PURPOSES[purpose]]) + part.to_bytes(3, "little")
            + slot.to_bytes(8, "little"))


def keystream(key: bytes, nonce: bytes, nbytes: int) -> bytes:
    """``nbytes`` of the ChaCha20 keystream under ``key`` and the 16-byte ``nonce``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    if len(key) != KEY_BYTES:
        raise PrivacyError(f"a ChaCha20 key has {KEY_BYTES} bytes, got {len(key)}")
    return Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(nbytes))


def uniforms(key: bytes, nonce: bytes, count: int) -> np.ndarray:
    """``count`` fp64 uniforms in [0, 1) with 53 bits each, from the keystream's 64-bit words."""
    words = np.frombuffer(keystream(key, nonce, 8 * count), dtype="<u8")
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def torch_seed(seed: int) -> int:
    """A 64-bit ``torch.Generator`` seed from a 256-bit record seed (a PRF output; see the
    module docstring for what the generator keeps of it)."""
    return int.from_bytes(keystream(seed_key(seed), bytes(16), 8), "little")


def seed_key(seed: int) -> bytes:
    """The 32-byte ChaCha20 key a record seed stands for (little-endian; seeds < 2^256)."""
    if not 0 <= int(seed) < 1 << (8 * KEY_BYTES):
        raise PrivacyError(f"a record seed lies in [0, 2^256), got {seed}")
    return int(seed).to_bytes(KEY_BYTES, "little")


@dataclass(frozen=True)
class RoundKey:
    """One round's secret key; every record's randomness is derived from it and its slot."""

    key: bytes = field(repr=False)   # never printed, logged or saved
    round_index: int = 0

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise PrivacyError(f"a round key has {KEY_BYTES} bytes, got {len(self.key)}")

    def stream(self, slot: int, part: int, purpose: str, nbytes: int) -> bytes:
        """The first ``nbytes`` of record (slot, part)'s stream for ``purpose``."""
        return keystream(self.key, _nonce(slot, part, purpose), nbytes)

    def seed(self, slot: int, part: int, purpose: str) -> int:
        """A 256-bit seed: the first 32 bytes of the record's stream for ``purpose``."""
        return int.from_bytes(self.stream(slot, part, purpose, SEED_BYTES), "little")

    def uniforms(self, slot: int, part: int, purpose: str, count: int) -> np.ndarray:
        """``count`` 53-bit uniforms in [0, 1) from the record's stream for ``purpose``."""
        return uniforms(self.key, _nonce(slot, part, purpose), count)

    def reader(self, slot: int, part: int, purpose: str) -> Callable[[int], bytes]:
        """An entropy source (``nbytes -> bytes``) reading the record's stream from its start."""
        return lambda nbytes: self.stream(slot, part, purpose, nbytes)


@dataclass(frozen=True)
class PromptCoins:
    """The randomness of this rank's prompts in one round: prompt i belongs to ``owners[i]``,
    a (slot, part) pair, and draws only from that pair's streams."""

    key: RoundKey = field(repr=False)
    owners: tuple[tuple[int, int], ...]

    @classmethod
    def for_records(cls, key: RoundKey, slots: Sequence[int],
                    bounds: Sequence[int]) -> PromptCoins:
        """Record r (public slot ``slots[r]``) owns prompts ``bounds[r]:bounds[r + 1]``."""
        if len(bounds) != len(slots) + 1:
            raise PrivacyError(f"{len(slots)} records but {len(bounds) - 1} prompt ranges")
        owners = [(int(s), j) for s, lo, hi in zip(slots, bounds[:-1], bounds[1:])
                  for j in range(hi - lo)]
        return cls(key, tuple(owners))

    def __len__(self) -> int:
        return len(self.owners)

    def seeds(self, purpose: str) -> list[int]:
        """One 256-bit seed per prompt (rollouts, dropout)."""
        return [self.key.seed(s, j, purpose) for s, j in self.owners]

    def uniforms(self, purpose: str, count: int) -> torch.Tensor:
        """``(P, count)`` fp64 uniforms, row i from prompt i's own stream (shuffles)."""
        rows = [self.key.uniforms(s, j, purpose, count) for s, j in self.owners]
        return torch.from_numpy(np.stack(rows)) if rows else torch.zeros((0, count),
                                                                          dtype=torch.float64)


class RecordRandomness(RoundKeyed):
    """The run's source of round keys (secure: os.urandom; seeded: the debugging seed).

    Args:
        seed: ``None`` (default) for a fresh 256-bit OS-entropy key every round (releasable);
            an integer for a reproducible debugging run (never releasable).
        entropy: the key source in secure mode (default :func:`read_entropy`); tests and
            ``dpgrpo verify`` pass a recorder to count the bytes read.
    """

    KEY_BITS = 8 * KEY_BYTES

    def __init__(self, *, seed: int | None = None,
                 entropy: Callable[[int], bytes] | None = None) -> None:
        self.seed, self._entropy = seed, entropy

    def round_key(self, round_index: int) -> RoundKey:
        """Round ``round_index``'s key: fresh from the OS (secure), or SHA-256 of the seed and
        the round (seeded; a replayed round gets the same key, so nothing needs saving)."""
        if self.secure:
            key = bytes((self._entropy or read_entropy)(KEY_BYTES))
            if len(key) != KEY_BYTES:
                raise PrivacyError(f"the entropy source returned {len(key)} bytes, "
                                   f"not {KEY_BYTES}")
        else:
            seed = int(self.seed)  # type: ignore[arg-type]
            material = f"dpgrpo-record-debug-seed:{seed}:{int(round_index)}"
            key = hashlib.sha256(material.encode()).digest()
        return RoundKey(key, int(round_index))

    def state_dict(self) -> GeneratorState:
        """Nothing to restore: secure keys are fresh, seeded keys a function of the round."""
        return {"source": "os-entropy"} if self.secure else {"source": "seeded", "seed": self.seed}

    def load_state_dict(self, state: object) -> None:
        if isinstance(state, dict) and state.get("source") == "seeded" and self.secure:
            raise PrivacyError("cannot restore a seeded record-randomness state into a "
                               "secure run")


__all__ = ["GENERATOR", "KEY_BYTES", "PURPOSES", "PromptCoins", "RecordRandomness", "RoundKey",
           "keystream", "read_entropy", "seed_key", "torch_seed", "uniforms"]
