"""``dpgrpo verify`` checks of the privacy randomness itself (issue 32; ``group="mechanism"``).

Each check runs the live generators (the sampler, the noise source, the record streams the
trainer uses) and measures one structural property a mutation would break: the keystream never
restarts (no repeated noise across 2^16-coordinate blocks or calls), every coordinate sums four
different Box-Muller pairs, the Poisson coins have 53-bit resolution and the right inclusion
frequency at a small q, and a record's randomness has 256 secret bits and ignores its
batch-mates. Structural checks read a fixed public key or stream, so their verdict is
deterministic (a bug fails every time, never by chance); the secret-bit checks read
``os.urandom`` as a run does.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from dpgrpo.privacy.noise import SECURE_DRAWS, NoiseSource, box_muller, combine_draws
from dpgrpo.privacy.record_coins import PURPOSES, PromptCoins, RecordRandomness, RoundKey, keystream
from dpgrpo.privacy.sampling import PoissonSampler
from dpgrpo.verify.registry import check

BLOCK = 1 << 16                      # the noise's keystream chunk (coordinates)
PUBLIC_KEY = bytes(range(100, 132))  # a fixed public key: structural checks are deterministic
#: MATH preset's q: expected batch 128 of n = 6,988 slots
SMALL_Q = 128 / 6988
SMALL_Q_SLOTS = 1 << 20


def noise_block_repeats() -> int:
    """Exactly repeated doubles among 3.5 blocks of noise and a second call of one round."""
    source = NoiseSource(entropy=lambda n: PUBLIC_KEY)
    source.start_round()
    first, second = source.normal((3 * BLOCK + BLOCK // 2,), 1.0), source.normal((BLOCK,), 1.0)
    both = torch.cat([first, second])
    return int(both.numel() - torch.unique(both).numel())


def noise_block_correlation() -> float:
    """Largest |correlation| between two of 4 blocks of 2^16 coordinates (3 in one call, the
    4th from the next call): about 1/256 for independent blocks, 1 for a restarted stream."""
    source = NoiseSource(entropy=lambda n: PUBLIC_KEY)
    source.start_round()
    first = source.normal((3 * BLOCK,), 1.0)
    blocks = [first[i * BLOCK:(i + 1) * BLOCK] for i in range(3)] + [source.normal((BLOCK,), 1.0)]
    corr = torch.corrcoef(torch.stack(blocks)).abs()
    return float(corr[~torch.eye(len(blocks), dtype=torch.bool)].max())


def pairs_per_coordinate(count: int = 9) -> int:
    """Fewest distinct Box-Muller pairs any coordinate depends on (perturbing one pair's radius
    at a time); SECURE_DRAWS when each coordinate sums draws of different pairs."""
    pairs = SECURE_DRAWS * ((count + 1) // 2)
    words = np.frombuffer(keystream(PUBLIC_KEY, bytes(16), 8 * 5 * pairs), dtype="<u8")
    words = words.reshape(5, pairs).copy()
    base = combine_draws(box_muller(words), count)
    depends = [0] * count
    for k in range(pairs):
        moved = words.copy()
        moved[0, k] ^= np.uint64(1 << 63)
        for j in (combine_draws(box_muller(moved), count) != base).nonzero().flatten().tolist():
            depends[j] += 1
    return min(depends)


def _word(u_index: int) -> int:
    """A 64-bit coin word whose 53-bit uniform is ``u_index / 2^53`` (low 11 bits all set)."""
    return (u_index << 11) | 0x7FF


def coin_resolution_bits(q: float = SMALL_Q) -> int:
    """The largest b <= 53 such that a slot whose coin lies 2^-b below q is sampled and one
    2^-b above is not, for every b' <= b: the resolution of the Poisson coins at q."""
    edge = q * 2.0 ** 53                               # exact: scaling by a power of two
    good = 0
    for b in range(1, 54):
        step = 2 ** (53 - b)
        below, above = math.ceil(edge) - step, math.floor(edge) + step
        if below < 0 or above >= 2 ** 53:
            continue
        words = np.array([_word(below), _word(above)], dtype="<u8").tobytes()

        def entropy(n: int, w: bytes = words) -> bytes:
            return w

        sampled = PoissonSampler(2, q, entropy=entropy).sample().tolist()
        if sampled != [0]:
            break
        good = b
    return good


def small_q_frequency_z() -> float:
    """|count - n q| / sqrt(n q (1 - q)) for one round of 2^20 slots at the MATH preset's q,
    the coins a fixed public ChaCha20 stream (deterministic); 8-bit coins give 9.4."""
    n, q = SMALL_Q_SLOTS, SMALL_Q
    coins = PoissonSampler(n, q, entropy=lambda k: keystream(PUBLIC_KEY, bytes(16), k))
    count = coins.sample().size
    return abs(count - n * q) / math.sqrt(n * q * (1 - q))


def record_secret_bits() -> int:
    """Bits of one secure round's os.urandom read whose single flip changes a record's rollout
    and dropout seeds; minimum over 2 rounds (a round that reads nothing, or reads fewer than
    16 bytes, scores its read's width at most)."""
    reads: list[bytes] = []

    def record(k: int) -> bytes:
        reads.append(os.urandom(k))
        return reads[-1]

    source, bits = RecordRandomness(entropy=record), []
    for t in range(2):
        before = len(reads)
        key = source.round_key(t)
        fresh = reads[before:]
        if len(fresh) != 1:
            bits.append(0)
            continue
        base = (key.seed(3, 0, "rollout"), key.seed(3, 0, "dropout"))
        changed = 0
        for bit in range(8 * len(fresh[0])):
            flipped = bytearray(fresh[0])
            flipped[bit // 8] ^= 1 << (bit % 8)
            key_bytes = bytes(flipped)

            def entropy(k: int, b: bytes = key_bytes) -> bytes:
                return b

            other = RecordRandomness(entropy=entropy).round_key(t)
            changed += all(a != b for a, b in zip(base, (other.seed(3, 0, "rollout"),
                                                         other.seed(3, 0, "dropout"))))
        bits.append(changed)
    return min(bits)


def record_binding_mismatches() -> int:
    """How many of slot 5's seeds (every purpose) differ between slot 5 alone and slot 5
    third among three other records, or second record of a two-prompt contributor round."""
    key = RoundKey(PUBLIC_KEY)
    alone = PromptCoins.for_records(key, [5], [0, 1])
    crowd = PromptCoins.for_records(key, [7, 2, 5, 9], [0, 1, 2, 3, 4])
    people = PromptCoins.for_records(key, [1, 5], [0, 2, 3])
    bad = 0
    for purpose in PURPOSES:
        want = alone.seeds(purpose)[0]
        bad += crowd.seeds(purpose)[2] != want
        bad += people.seeds(purpose)[2] != want
    return bad


@check("noise_block_repeats", tolerance=0.0,
       detail="repeated fp64 values in 3.5 blocks of 2^16 noise coordinates plus a second call "
              "of one round (fixed public key): 0 unless the keystream restarts")
def _noise_repeats() -> float:
    return float(noise_block_repeats())


@check("noise_block_correlation", tolerance=5 / 256,
       detail="max |correlation| between 4 blocks of 2^16 noise coordinates (fixed public key);"
              " tolerance 5 standard errors of independent blocks")
def _noise_corr() -> float:
    return noise_block_correlation()


@check("noise_pairs_per_coordinate", tolerance=SECURE_DRAWS - 1, comparison=">",
       detail=f"fewest distinct Box-Muller pairs behind one noise coordinate; must be "
              f"{SECURE_DRAWS} (the sum of {SECURE_DRAWS} draws from different pairs)")
def _pairs() -> float:
    return float(pairs_per_coordinate())


@check("poisson_coin_resolution_bits", tolerance=52.0, comparison=">",
       detail="bits of resolution of the Poisson coins at q = 128/6,988 (the MATH preset): a "
              "coin 2^-b below q is sampled and one 2^-b above is not; must be 53")
def _coin_bits() -> float:
    return float(coin_resolution_bits())


@check("poisson_small_q_frequency_z", tolerance=6.0,
       detail="|sampled - n q| / sqrt(n q (1-q)), one round of 2^20 slots at q = 128/6,988, "
              "coins from a fixed public stream (deterministic; 8-bit coins give ~9)")
def _small_q() -> float:
    return small_q_frequency_z()


@check("record_randomness_secret_bits", tolerance=127.0, comparison=">",
       detail="bits of a secure round's os.urandom read whose flip changes a record's rollout "
              "and dropout seeds; minimum over 2 rounds; must be >= 128")
def _record_bits() -> float:
    return float(record_secret_bits())


@check("record_randomness_binding", tolerance=0.0,
       detail="a record's rollout, dropout, shuffle and choice seeds that change with its "
              "batch-mates or position (must be 0)")
def _record_binding() -> float:
    return float(record_binding_mismatches())


__all__ = ["coin_resolution_bits", "noise_block_correlation", "noise_block_repeats",
           "pairs_per_coordinate", "record_binding_mismatches", "record_secret_bits",
           "small_q_frequency_z"]
