"""Model-free checks of ``dpgrpo verify`` (paper, Appendix B): the sampler, the mechanism, the
noise source and the accountant (``group="mechanism"``)."""

from __future__ import annotations

import math
import os
from typing import TypedDict

import numpy as np
import torch

from dpgrpo.privacy.accounting import RoundEvent, pld_epsilon
from dpgrpo.privacy.mechanism import clip_and_sum, privatize
from dpgrpo.privacy.noise import TAIL_FRACTION_OF_DELTA, NoiseSource, noise_tail_delta
from dpgrpo.privacy.sampling import PoissonSampler
from dpgrpo.verify.registry import check


def _records(b: int, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"layer1.weight": (8, 4), "layer1.bias": (8,), "layer2.weight": (2, 8)}
    return {
        k: scale * torch.randn((b, *s), generator=g, dtype=torch.float64) for k, s in shapes.items()
    }


def _norm(d: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(v.pow(2).sum()) for v in d.values()))


@check(
    "global_sensitivity",
    tolerance=1e-10,
    detail="max ||f(D')-f(D)||/C - 1 over 20 random and 1 adversarial (1e12) additions, "
    "C=0.7, fp64",
)
def _sensitivity() -> float:
    clip, base = 0.7, _records(5, 0)
    f_d = clip_and_sum(base, clip)
    worst = 0.0
    for i in range(21):
        extra = _records(1, 100 + i, 1e12 if i == 20 else 10.0 ** (i % 5 - 2))
        f_d2 = clip_and_sum({k: torch.cat([base[k], extra[k]]) for k in base}, clip)
        worst = max(worst, _norm({k: f_d2[k] - f_d[k] for k in f_d}) / clip)
    return worst - 1.0


@check("no_clip_no_noise_is_plain_sum", tolerance=0.0,
       detail="max |privatize(C=inf, sigma=0, qn=1) - sum| (fp64)")
def _plain_sum() -> float:
    recs = _records(7, 1)
    out = privatize(recs, clip_norm=math.inf, noise_multiplier=0.0, expected_batch=1.0,
                    noise=NoiseSource(seed=0))
    return max(float((out.update[k] - recs[k].sum(0)).abs().max()) for k in recs)


@check(
    "noise_std_matches_sigma_c",
    tolerance=1e-6,
    comparison=">",
    detail="two-sided chi-square p-value of 200,000 noise coordinates against sigma*C "
    "(false-alarm 1e-6)",
)
def _noise_std() -> float:
    from scipy import stats

    sigma, clip, n = 0.8, 0.05, 200_000
    empty = {"w": torch.zeros((0, n), dtype=torch.float64)}
    z = privatize(empty, clip_norm=clip, noise_multiplier=sigma, expected_batch=1.0,
                  noise=NoiseSource()).update["w"]
    stat = float(z.pow(2).sum()) / (sigma * clip) ** 2
    return 2 * min(stats.chi2.cdf(stat, n), stats.chi2.sf(stat, n))


@check("empty_batch_noise_only", tolerance=0.0,
       detail="max |update - z/(qn)| for an empty batch with a replayed seeded noise stream")
def _empty_batch() -> float:
    empty = {"w": torch.zeros((0, 3, 5), dtype=torch.float64)}
    out = privatize(
        empty, clip_norm=0.1, noise_multiplier=2.0, expected_batch=4.0, noise=NoiseSource(seed=9)
    )
    replay = NoiseSource(seed=9)
    replay.start_round()
    expected = replay.normal((3, 5), 0.2, torch.float64) / 4.0
    return float((out.update["w"] - expected).abs().max())


@check("public_denominator", tolerance=0.0,
       detail="max |update - sum/(qn)| with 3 records and q*n = 12.5 (never the realized size)")
def _denominator() -> float:
    recs = _records(3, 2, 1e-3)
    out = privatize(
        recs, clip_norm=10.0, noise_multiplier=0.0, expected_batch=12.5, noise=NoiseSource(seed=0)
    )
    update = out.update
    return max(float((update[k] - recs[k].sum(0) / 12.5).abs().max()) for k in recs)


@check("nonfinite_record_zeroed", tolerance=0.0,
       detail="max |contribution| of a record with a NaN entry (fixed per-record rule)")
def _nonfinite() -> float:
    recs = _records(2, 3)
    recs["layer1.bias"][1, 0] = float("nan")
    out = clip_and_sum(recs, 1e9)
    return max(float((out[k] - recs[k][0]).abs().max()) for k in recs)


def noise_round_independence(rounds: int = 8, coordinates: int = 1 << 15) -> dict:
    """The rounds' noise through the real mechanism (an empty batch: each round's update is its
    noise alone, OS entropy): :func:`dpgrpo.audit.independence.round_independence` over the
    ``rounds`` noise vectors, read as ``coordinates`` excluded canaries each."""
    from dpgrpo.audit.independence import round_independence

    source, empty = NoiseSource(), {"w": torch.zeros((0, coordinates), dtype=torch.float64)}
    noise = np.stack([privatize(empty, clip_norm=1.0, noise_multiplier=1.0,
                                expected_batch=1.0, noise=source).update["w"].numpy()
                      for _ in range(rounds)])
    return round_independence(noise, np.zeros(coordinates, dtype=bool)).to_dict()


@check("noise_independent_across_rounds", tolerance=1e-6, comparison=">",
       detail="smallest p-value (times 3, Bonferroni) of three statistics of the correlation "
              "between 8 rounds' noise vectors (2^15 coordinates each, an empty batch through "
              "privatize, OS entropy): max |Fisher z| of consecutive rounds, of any two rounds, "
              "and the mean z of consecutive rounds; a round key reused gives 0")
def _noise_rounds() -> float:
    ind = noise_round_independence()
    return min(1.0, 3.0 * min(ind["p_values"].values()))


def _influential_key_bits(key: bytes, base: torch.Tensor) -> int:
    """How many single-bit flips of ``key`` change the noise drawn from it."""
    changed = 0
    for bit in range(8 * len(key)):
        flipped = bytearray(key)
        flipped[bit // 8] ^= 1 << (bit % 8)
        key_bytes = bytes(flipped)

        def entropy(k: int, b: bytes = key_bytes) -> bytes:
            return b

        replay = NoiseSource(entropy=entropy)
        replay.start_round()
        changed += not torch.equal(replay.normal(base.shape, 1.0), base)
    return changed


@check("noise_secret_bits", tolerance=127.0, comparison=">",
       detail="secret bits behind one round's noise: bits read from os.urandom at that round's "
              "start whose single flip changes the round's noise; minimum over 2 rounds of one "
              "secure source (a round that reads nothing scores 0); must be >= 128")
def _secret_bits() -> float:
    reads: list[bytes] = []

    def record(k: int) -> bytes:
        reads.append(os.urandom(k))
        return reads[-1]

    source, bits = NoiseSource(entropy=record), []
    for _ in range(2):
        before = len(reads)
        source.start_round()
        base = source.normal((8,), 1.0)
        fresh = reads[before:]
        bits.append(_influential_key_bits(fresh[0], base) if len(fresh) == 1 else 0)
    return float(min(bits))


class _TailPreset(TypedDict):
    n: int
    rounds: int
    epsilon: float
    coordinates: int


#: The MATH preset (configs/math.toml): n = 6,988, T = 50, epsilon = 8 (the calibrated
#: certified epsilon is at most 8), delta = 1/(10 n), and d = 4,616,192 LoRA coordinates:
#: Qwen2.5-1.5B (28 layers, hidden 1536, MLP 8960, k/v 256), rank 4 on q,k,v,o,gate,up,down,
#: 28 * 4 * (3072 + 1792 + 1792 + 3072 + 3 * 10496).
TAIL_PRESET: _TailPreset = {"n": 6988, "rounds": 50, "epsilon": 8.0, "coordinates": 4_616_192}


@check("noise_tail_delta", tolerance=TAIL_FRACTION_OF_DELTA / (10 * TAIL_PRESET["n"]),
       detail="(1 + e^eps) T * 4 draws * d * 2^-256, the truncated-tail term added to delta, for "
              "the MATH preset (d = 4,616,192, T = 50, eps = 8); tolerance 1% of its delta")
def _tail_delta() -> float:
    t = TAIL_PRESET
    return noise_tail_delta(t["coordinates"], t["rounds"], t["epsilon"])


def _poisson_matrix() -> np.ndarray:
    sampler, x = PoissonSampler(6, 0.2), np.zeros((20_000, 6))
    for t in range(20_000):
        x[t, sampler.sample()] = 1.0
    return x


_POISSON: dict[str, np.ndarray] = {}


def _poisson() -> np.ndarray:
    if "x" not in _POISSON:
        _POISSON["x"] = _poisson_matrix()
    return _POISSON["x"]


@check("poisson_inclusion_frequency", tolerance=0.012,
       detail="max |inclusion frequency - q|, 6 slots, q=0.2, 20,000 trials, OS entropy")
def _poisson_freq() -> float:
    return float(np.abs(_poisson().mean(axis=0) - 0.2).max())


@check("poisson_independence", tolerance=0.035,
       detail="max |off-diagonal inclusion correlation|, 6 slots, q=0.2, 20,000 trials")
def _poisson_corr() -> float:
    corr = np.corrcoef(_poisson(), rowvar=False)
    return float(np.abs(corr[~np.eye(6, dtype=bool)]).max())


@check("accountant_jax_privacy_reference", tolerance=1e-3,
       detail="|PLD epsilon - 3.77| for q=0.1, sigma=3, T=512, delta=1e-6 (JAX-Privacy reference)")
def _jax_reference() -> float:
    return abs(pld_epsilon([RoundEvent(0.1, 3.0, 512)], 1e-6) - 3.77)


class _AuditPreset(TypedDict):
    sigma: float
    clip_norm: float
    rounds: int
    canaries: int
    coordinates: int


#: Audit mode of the study's operating point (sigma 0.344, C 0.055, T 12) at q = 1, with 1,000
#: gradient canaries in a 2,048-coordinate space (the statistic does not depend on d).
AUDIT_PRESET: _AuditPreset = {"sigma": 0.344, "clip_norm": 0.055, "rounds": 12, "canaries": 1000,
                "coordinates": 2048}


def audit_verdict_errors(mechanism: str = "correct") -> int:
    """Wrong verdicts of the white-box audit over the real mechanism and the six broken ones:
    ``mechanism`` should pass and each broken one be flagged. Passing a broken name as
    ``mechanism`` (what a bug in privatize would look like) makes the check fail."""
    from dpgrpo.audit.mechanism_audit import detection
    from dpgrpo.audit.whitebox import BROKEN, AuditSetup

    a = AUDIT_PRESET
    setup = AuditSetup(n=a["canaries"], q=1.0, rounds=a["rounds"], sigma=a["sigma"],
                       clip_norm=a["clip_norm"], delta=1e-5, coordinates=a["coordinates"],
                       canaries=a["canaries"])
    broken = tuple(b for b in BROKEN if b != mechanism)
    out = detection(setup, mechanisms=(mechanism, *broken))
    return out[mechanism]["flagged"] + sum(1 - out[b]["flagged"] for b in broken)


@check("audit_detects_broken_mechanism", tolerance=0.0,
       detail="wrong verdicts of the white-box gradient-canary audit at q = 1 (1,000 canaries, "
              "sigma 0.344, T 12): the real mechanism must pass (measured mu within 5% of "
              "sqrt(T)/sigma, noise scale within 5%, rounds' noises uncorrelated) and sigma/2, "
              "no clipping (canaries of norm 10 C), noise on half the coordinates, the "
              "realized-batch denominator, noise per prompt and one noise vector reused every "
              "round must each be flagged; OS entropy")
def _audit_detects_broken() -> float:
    return float(audit_verdict_errors())


def reset() -> None:
    """Forget the cached Poisson draws, so that every run of the checks samples afresh."""
    _POISSON.clear()
