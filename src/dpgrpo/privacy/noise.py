"""Cryptographic Gaussian noise for the mechanism (Algorithm 1, line 8).

How a round's noise is made:

1. **Secret.** ``start_round`` reads a fresh 256-bit key from ``os.urandom`` (the operating
   system's cryptographic source). Nothing else is secret and nothing links rounds: recovering
   one round's noise means guessing 256 bits. (The previous design reseeded torch's CPU
   generator, which keeps only the low 32 bits of a seed, so 2^32 guesses recovered a round.)
2. **Stream.** The key drives a ChaCha20 keystream (RFC 8439, OpenSSL through the
   ``cryptography`` package; nonce zero, a key is never reused).
3. **Uniforms to normals, in fp64 on the CPU.** Each Box-Muller pair reads five 64-bit words:
   a radius uniform ``u1 = (w1 2^192 + w2 2^128 + w3 2^64 + w4 + 1) / 2^256`` in ``(0, 1]``
   (256 bits, so the radius ``sqrt(-2 ln u1)`` reaches 18.84 standard deviations) and an angle
   uniform of 53 bits. (128-bit radii, as before, left a truncated-tail term that made every
   run above epsilon ~70 uncertifiable; see "Truncated tails".)
4. **Sum of draws.** Every coordinate is ``(z_1 + z_2 + z_3 + z_4) / 2``, four independent
   Box-Muller outputs from four different pairs (:func:`combine_draws`): exactly N(0, 1) in
   distribution. This is Opacus' ``secure_mode`` defence
   against floating-point attacks (Holohan and Braghin, 2021): a single sampler reaches only a
   sparse, uneven set of doubles, and an observer of an exact noisy double could test which
   un-noised value makes it reachable (Mironov, CCS 2012). Summing fills those gaps. It costs
   four times the stream: ``bench/noise.py`` measured 0.22 s of one CPU core per round for
   the paper's 4.6M LoRA coordinates with 128-bit radii (3.5x torch's fp64 ``normal_``;
   bench/README.md has the figure for 256-bit radii), against a minute of rollouts per round. The
   noise is added to the fp64 clipped sum and only then divided by q*n and cast (post-processing);
   on a GPU it is generated here, on the CPU, and transferred.

Truncated tails. The largest reachable |draw| is ``R_MAX = sqrt(2 * 256 * ln 2)``; a pair is
truncated exactly when the ideal radius uniform falls below 2^-256. Coupling every pair with the
ideal one, the whole run's noise differs from the ideal Gaussian's with probability at most
``eta = rounds * SECURE_DRAWS * d * 2^-256`` (one pair per coordinate and draw, an overcount).
A mechanism within total variation ``eta`` of an (eps, delta)-DP one is
(eps, delta + (1 + e^eps) eta)-DP, so :func:`noise_tail_delta` returns ``(1 + e^eps) eta`` and
the certificate adds it to the accountant's delta. The remaining gap, that each draw is a double
and not a real number (its low-order bits), is assumption A4; it is not quantified here.

``seeded`` mode (debugging, reproducible experiments) derives round t's key from the user's seed
by SHA-256; it is fully reproducible and therefore never releasable.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpgrpo.errors import PrivacyError
from dpgrpo.privacy.seeds import RoundKeyed

if TYPE_CHECKING:
    from dpgrpo.privacy.seeds import GeneratorState

KEY_BYTES = 32                 # 256-bit ChaCha20 key, fresh per round
SECURE_DRAWS = 4               # Box-Muller draws summed per coordinate (Opacus secure_mode)
RADIUS_WORDS = 4               # 64-bit words per radius uniform
RADIUS_BITS = 64 * RADIUS_WORDS  # resolution of the radius uniform (256)
R_MAX = math.sqrt(2.0 * RADIUS_BITS * math.log(2.0))   # largest reachable |draw|, 18.84
PAIR_WORDS = RADIUS_WORDS + 1  # words per Box-Muller pair (radius, then angle)
TAIL_FRACTION_OF_DELTA = 0.01  # a run refuses to start if the tail term exceeds this share
GENERATOR = (f"ChaCha20 keystream (cryptography/OpenSSL), {8 * KEY_BYTES}-bit key from "
             f"os.urandom every round; fp64 Box-Muller with {RADIUS_BITS}-bit radius uniforms; "
             f"each coordinate the sum of {SECURE_DRAWS} draws / {math.sqrt(SECURE_DRAWS):g}")
_CHUNK = 1 << 16               # coordinates per keystream chunk (bounded memory)


def read_entropy(nbytes: int) -> bytes:
    """The operating system's cryptographic source (one call per round in secure mode)."""
    return os.urandom(nbytes)


def _fp64(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(words.astype(np.float64))


def box_muller(words: np.ndarray) -> torch.Tensor:
    """Standard normals from ``(PAIR_WORDS, m)`` uint64 words: ``2m`` fp64 values (m cosines,
    m sines).

    Column ``(w1, w2, w3, w4, c)``: radius uniform ``(w1 + (w2 + (w3 + (w4 + 1) 2^-64) 2^-64)
    2^-64) 2^-64`` in ``(0, 1]`` (exactly ``2^-256`` when every word is 0), angle uniform
    ``(c >> 11) 2^-53`` in ``[0, 1)``. Bits to doubles in numpy; logarithm and trigonometry in
    torch (vectorized and multi-threaded, about 4x numpy on one core).
    """
    u1 = _fp64(words[RADIUS_WORDS - 1]).add_(1.0)
    for i in range(RADIUS_WORDS - 2, -1, -1):          # Horner, least significant word first
        u1.mul_(2.0 ** -64).add_(_fp64(words[i]))
    u1.mul_(2.0 ** -64)
    radius = u1.log_().mul_(-2.0).sqrt_()
    angle = _fp64(words[RADIUS_WORDS] >> np.uint64(11)).mul_(2.0 * math.pi * 2.0 ** -53)
    out = torch.empty((2, words.shape[1]), dtype=torch.float64)
    torch.cos(angle, out=out[0])
    torch.sin(angle, out=out[1])
    return out.mul_(radius).reshape(-1)


class _Stream:
    """One round's ChaCha20 keystream, consumed in order by successive draws."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        if len(key) != KEY_BYTES:
            raise PrivacyError(f"a noise key has {KEY_BYTES} bytes, got {len(key)}")
        self._cipher = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def words(self, count: int) -> np.ndarray:
        return np.frombuffer(self._cipher.update(bytes(8 * count)), dtype="<u8")

    def standard_normals(self, count: int) -> torch.Tensor:
        """``count`` fp64 N(0, 1) values, each the scaled sum of SECURE_DRAWS Box-Muller draws
        from SECURE_DRAWS different pairs; the stream continues across chunks and calls."""
        out = torch.empty(count, dtype=torch.float64)
        for start in range(0, count, _CHUNK):
            c = min(_CHUNK, count - start)
            pairs = (c + 1) // 2
            out[start:start + c] = combine_draws(
                box_muller(self.words(PAIR_WORDS * SECURE_DRAWS * pairs).reshape(PAIR_WORDS, -1)),
                c)
        return out.div_(math.sqrt(SECURE_DRAWS))


def combine_draws(draws: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` unscaled sums of SECURE_DRAWS draws from :func:`box_muller`'s output (``2m``
    values, the m cosines then the m sines, ``m = SECURE_DRAWS * ceil(count / 2)`` pairs).

    With ``p = m / SECURE_DRAWS``, coordinate ``j < p`` sums the cosines of pairs ``j, p + j,
    2p + j, 3p + j`` and coordinate ``p + j`` their sines: four draws from four *different*
    pairs (four radii), so no coordinate rests on fewer than four independent radius uniforms
    (summing the cosine and sine of one pair, as before, halved the floating-point defence).
    The cosine and sine of one pair are independent N(0, 1), so the two coordinates sharing
    four pairs are independent and each is exactly SECURE_DRAWS times N(0, 1) in variance.
    """
    m = draws.numel() // 2
    if m % SECURE_DRAWS or 2 * (m // SECURE_DRAWS) < count:
        raise PrivacyError(f"{m} Box-Muller pairs cannot make {count} sums of {SECURE_DRAWS}")
    p = m // SECURE_DRAWS
    return draws.reshape(2, SECURE_DRAWS, p).sum(dim=1).reshape(-1)[:count]


def seeded_key(seed: int, round_index: int) -> bytes:
    """Round ``round_index``'s key in seeded (debugging) mode: SHA-256 of the seed and round."""
    material = f"dpgrpo-noise-debug-seed:{int(seed)}:{int(round_index)}".encode()
    return hashlib.sha256(material).digest()


def noise_tail_delta(coordinates: int, rounds: int, epsilon: float) -> float:
    """``(1 + e^eps) * rounds * SECURE_DRAWS * d * 2^-256``: the truncated tails' share of delta.

    ``coordinates`` is d, the public number of trainable coordinates; ``rounds`` every round
    that drew noise (replays included). See the module docstring for the coupling argument.
    """
    if coordinates < 0 or rounds < 0:
        raise PrivacyError(f"coordinates and rounds must be >= 0, got {coordinates}, {rounds}")
    eta = float(rounds) * SECURE_DRAWS * float(coordinates) * 2.0 ** -RADIUS_BITS
    if eta == 0.0:
        return 0.0
    if not epsilon < 700:  # e^eps overflows a double: the term is unbounded
        return math.inf
    return (1.0 + math.exp(epsilon)) * eta


def check_noise_tail(tail_delta: float, delta: float) -> None:
    """Refuse a run whose noise-tail term exceeds 1% of delta (PrivacyError)."""
    if not tail_delta <= TAIL_FRACTION_OF_DELTA * delta:
        raise PrivacyError(
            f"the noise generator's truncated tails add {tail_delta:.3g} to delta = {delta:.3g}, "
            f"more than {TAIL_FRACTION_OF_DELTA:.0%}: fewer rounds or coordinates, or a smaller "
            "epsilon, are needed for the certificate to stay honest")


class NoiseSource(RoundKeyed):
    """Draws N(0, std^2) noise as fp64 CPU tensors; see the module docstring.

    Args:
        seed: ``None`` (default) for a fresh OS-entropy key every round (releasable); an
            integer for the reproducible debugging stream (never releasable).
        entropy: the key source in secure mode (default :func:`read_entropy`); tests and
            ``dpgrpo verify`` pass a recorder to count and inspect the bits read.
    """

    KEY_BITS = 8 * KEY_BYTES

    def __init__(self, *, seed: int | None = None,
                 entropy: Callable[[int], bytes] | None = None) -> None:
        self.seed = seed
        self._entropy = entropy
        self._round = 0          # seeded mode: index of the next round's key
        self._stream: _Stream | None = None

    def start_round(self) -> None:
        """Begin a round: a fresh key from the OS (secure) or the seed's next key (seeded)."""
        if self.secure:
            key = (self._entropy or read_entropy)(KEY_BYTES)
        else:
            key = seeded_key(self.seed, self._round)  # type: ignore[arg-type]
            self._round += 1
        self._stream = _Stream(bytes(key))

    def normal(self, shape: torch.Size | tuple[int, ...], std: float,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """i.i.d. N(0, std^2) entries (std may be 0: zeros), made in fp64 on the CPU.

        Successive calls within a round continue the round's stream. ``dtype`` casts the
        result; the mechanism keeps fp64.
        """
        if not std >= 0.0 or math.isinf(std):
            raise PrivacyError(f"noise standard deviation must be finite and >= 0, got {std}")
        count = math.prod(shape)
        if std == 0.0:
            return torch.zeros(shape, dtype=dtype)
        if self._stream is None:
            raise PrivacyError("noise drawn before start_round(): every round needs its own key")
        return self._stream.standard_normals(count).reshape(shape).mul_(std).to(dtype)

    def state_dict(self) -> GeneratorState:
        """What a resumed run needs: nothing in secure mode; the seed and round index if seeded."""
        if self.secure:
            return {"source": "os-entropy"}
        return {"source": "seeded", "seed": self.seed, "round": self._round}

    def load_state_dict(self, state: GeneratorState) -> None:
        if state.get("source") == "seeded":
            if self.secure:
                raise PrivacyError("cannot restore a seeded noise state into a secure noise source")
            if "round" not in state:
                raise PrivacyError("this seeded noise state predates the ChaCha20 generator; "
                                   "start the debugging run again")
            self._round = int(state["round"])
