"""The white-box mechanism audit's run: the real sampler, mechanism and noise over gradient
canaries (model-free mode; Nasr et al. 2023, Steinke et al. 2023, Andrew et al. 2024).

What runs is what training runs, minus the model: :class:`~dpgrpo.privacy.sampling.
PoissonSampler` with the run's n and q draws each round's slots; the first K slots are gradient
canaries (:mod:`dpgrpo.audit.gradient_canaries`), each included with probability 1/2 by
:func:`dpgrpo.audit.canary.draw_inclusion` (OS entropy); a sampled slot of an excluded canary is
a null record, exactly as in the trainer. The other n - K slots are background records with
zero or random clipped-size gradients. The per-record gradients go, as a mapping of two tensors
(the two halves of the trainable vector, like LoRA's A and B), through
:func:`dpgrpo.privacy.mechanism.privatize` with the certificate's sigma and C, the public q*n and a
:class:`~dpgrpo.privacy.noise.NoiseSource`; the update is what an AdamW step then uses.

The auditor observes (a) every round's privatized update, projected on each canary direction
(white-box: the strongest adversary the analysis covers, since DP of the whole transcript is
what the accountant certifies), and (b) only the final parameter delta after T AdamW steps from
zero (the final-model adversary, who sees a post-processing of (a)). Neither sees the Poisson
coins or the inclusion bits.

Broken mechanisms (:data:`MECHANISMS`) are built from the same real pieces with one thing wrong;
they exist so that the audit can be shown to fail them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from dpgrpo.audit.canary import draw_inclusion
from dpgrpo.audit.gradient_canaries import make_directions
from dpgrpo.errors import ConfigError
from dpgrpo.privacy.mechanism import (
    Grads,
    add_gaussian_noise,
    check_expected_batch,
    clip_and_sum,
    num_records,
    privatize,
    sanitize_nonfinite,
    sum_records,
)
from dpgrpo.privacy.noise import KEY_BYTES, NoiseSource, seeded_key
from dpgrpo.privacy.sampling import PoissonSampler

BACKGROUNDS = ("zero", "random")
#: The one-run bound is computed at delta' = min(delta, BOUND_DELTA_MASS / K): Steinke et al.'s
#: bound pays about 2 K delta', so at the run's delta = 1e-4 more than ~500 canaries only hurt;
#: at delta' the certificate claims its own, larger epsilon (PLD at delta'), printed beside.
BOUND_DELTA_MASS = 0.01
#: Audit mode (q = 1) puts every included canary in every round: it needs few canaries.
AUDIT_MODE_CANARIES = 1000


@dataclass(frozen=True)
class AuditSetup:
    """The public parameters of one audited run (the certificate's, or audit mode's).

    ``canary_scale`` is the canaries' gradient norm in units of C (> 1, so a correct mechanism
    clips them); ``direction_seed`` makes the public directions.
    """

    n: int
    q: float
    rounds: int
    sigma: float
    clip_norm: float
    delta: float
    coordinates: int
    canaries: int
    certified_epsilon: float | None = None
    canary_scale: float = 10.0
    background: str = "zero"
    learning_rate: float = 1e-2
    weight_decay: float = 0.0
    direction_seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.canaries <= self.n:
            raise ConfigError(f"need 1 <= canaries <= n = {self.n}, got {self.canaries}")
        if not 0.0 < self.q <= 1.0 or self.rounds < 1:
            raise ConfigError(f"need 0 < q <= 1 and T >= 1, got q = {self.q}, T = {self.rounds}")
        if not (self.sigma > 0 and self.clip_norm > 0 and math.isfinite(self.clip_norm)):
            raise ConfigError("the audit needs a private mechanism: sigma > 0 and a finite C > 0")
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(f"delta must lie in (0, 1), got {self.delta}")
        if self.coordinates < max(self.canaries, 2):
            raise ConfigError(f"{self.canaries} orthonormal canaries need at least that many "
                              f"trainable coordinates, got {self.coordinates}")
        if not self.canary_scale > 1.0:
            raise ConfigError("canary_scale must exceed 1 so that clipping acts on the canaries")
        if self.background not in BACKGROUNDS:
            raise ConfigError(f"background must be one of {BACKGROUNDS}, got {self.background!r}")

    @property
    def expected_batch(self) -> float:
        return self.q * self.n

    @property
    def bound_delta(self) -> float:
        """The delta at which the one-run bound is computed (:data:`BOUND_DELTA_MASS`)."""
        return min(self.delta, BOUND_DELTA_MASS / self.canaries)

    def audit_mode(self) -> AuditSetup:
        """The same sigma, C, T and space at q = 1 with every slot a canary (at most
        :data:`AUDIT_MODE_CANARIES`): every included canary is in every round, so its statistic
        is N(sqrt(T)/sigma, 1) (the GDP mu)."""
        k = min(self.canaries, AUDIT_MODE_CANARIES)
        return replace(self, q=1.0, n=k, canaries=k, background="zero")

    def to_dict(self) -> dict:
        return asdict(self)


Mechanism = Callable[..., Grads]


def _correct(grads: Grads, *, clip_norm: float, noise_multiplier: float, expected_batch: float,
             noise: NoiseSource) -> Grads:
    return privatize(grads, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                     expected_batch=expected_batch, noise=noise).update


def _scale(total: Grads, expected_batch: float) -> Grads:
    check_expected_batch(expected_batch)
    return {k: v / expected_batch for k, v in total.items()}


def _half_sigma(grads: Grads, *, noise_multiplier: float, **kw) -> Grads:
    return _correct(grads, noise_multiplier=noise_multiplier / 2, **kw)


def _no_clipping(grads: Grads, *, clip_norm: float, noise_multiplier: float,
                 expected_batch: float, noise: NoiseSource) -> Grads:
    total = sum_records(sanitize_nonfinite(grads)[0])
    noise.start_round()
    noisy = add_gaussian_noise(total, noise_multiplier, clip_norm, noise)
    return _scale(noisy, expected_batch)


def _half_coordinates(grads: Grads, *, clip_norm: float, noise_multiplier: float,
                      expected_batch: float, noise: NoiseSource) -> Grads:
    total = clip_and_sum(grads, clip_norm)
    first = next(iter(total))
    noise.start_round()
    noisy = add_gaussian_noise({first: total[first]}, noise_multiplier, clip_norm, noise)
    return _scale({k: noisy.get(k, v) for k, v in total.items()}, expected_batch)


def _realized_batch(grads: Grads, *, expected_batch: float, **kw) -> Grads:
    return _correct(grads, expected_batch=float(max(num_records(grads), 1)), **kw)


def _noise_per_prompt(grads: Grads, *, clip_norm: float, noise_multiplier: float,
                      expected_batch: float, noise: NoiseSource) -> Grads:
    # each of the B records adds its own N(0, sigma^2 C^2 / (q n)): the sum's noise has
    # variance sigma^2 C^2 B / (q n), a data-dependent scale (the same law as drawing B vectors)
    per = noise_multiplier * math.sqrt(num_records(grads) / expected_batch)
    return _correct(grads, clip_norm=clip_norm, noise_multiplier=per,
                    expected_batch=expected_batch, noise=noise)


#: The real mechanism and six deliberately broken ones (issues 27 and 58), by name.
MECHANISMS: dict[str, Mechanism] = {
    "correct": _correct,
    "half_sigma": _half_sigma,              # noise sigma/2 instead of sigma
    "no_clipping": _no_clipping,            # records summed unclipped (noise still sigma C)
    "half_coordinates": _half_coordinates,  # noise on the first tensor only
    "realized_batch": _realized_batch,      # divided by the realized batch, not q n
    "noise_per_prompt": _noise_per_prompt,  # N(0, sigma^2 C^2 / (q n)) per record, summed
    "reused_noise": _correct,               # the round key drawn once (_noise_source)
}
BROKEN = tuple(k for k in MECHANISMS if k != "correct")


def _noise_source(mechanism: str, seed: int | None) -> NoiseSource:
    """The run's noise source; for ``reused_noise`` one whose every round reads the same key,
    so that every round adds the same noise vector (the bug a round key drawn once makes)."""
    if mechanism != "reused_noise":
        return NoiseSource() if seed is None else NoiseSource(seed=seed + 1)
    key = os.urandom(KEY_BYTES) if seed is None else seeded_key(seed + 1, 0)
    return NoiseSource(entropy=lambda nbytes: key[:nbytes])


@dataclass(frozen=True)
class Observation:
    """What one audited run gives the auditor, and the secret bits to score guesses against.

    ``rounds``: (T, K) projections of each round's update on each canary, in units of the
    correct mechanism's noise, ``<u_i, update_t> q n / (sigma C)``; ``final``: (K,)
    projections of the negated final parameter delta (descent moves against the gradient).
    """

    included: np.ndarray        # (K,) bool, secret
    rounds: np.ndarray          # (T, K)
    final: np.ndarray           # (K,)
    seconds: float


def _background(count: int, d: int, clip: float, rng: np.random.Generator) -> torch.Tensor:
    g = rng.standard_normal((count, d))
    g *= clip / np.linalg.norm(g, axis=1, keepdims=True)
    return torch.from_numpy(g).float()


def simulate(setup: AuditSetup, mechanism: str = "correct", *,
             seed: int | None = None) -> Observation:
    """Run T rounds of ``mechanism`` over the canaries (module docstring); OS entropy for the
    inclusion bits, the sampler's coins and the noise unless ``seed`` is given (tests only)."""
    import time

    if mechanism not in MECHANISMS:
        raise ConfigError(f"unknown mechanism {mechanism!r}; choose from {sorted(MECHANISMS)}")
    start = time.perf_counter()
    mech, s, d, k = MECHANISMS[mechanism], setup, setup.coordinates, setup.canaries
    noise = _noise_source(mechanism, seed)
    sampler = PoissonSampler(s.n, s.q, seed=None if seed is None else seed + 2)
    gen = None if seed is None else torch.Generator().manual_seed(seed + 3)
    rng = np.random.default_rng(None if seed is None else seed + 4)
    included = np.array(draw_inclusion(k, gen), dtype=bool)
    dirs = make_directions(d, k, seed=s.direction_seed)
    scale = s.canary_scale * s.clip_norm
    theta = torch.nn.Parameter(torch.zeros(d))
    opt = torch.optim.AdamW([theta], lr=s.learning_rate, weight_decay=s.weight_decay)
    half = d // 2
    units = s.expected_batch / (s.sigma * s.clip_norm)
    rounds = np.empty((s.rounds, k))
    for t in range(s.rounds):
        slots = sampler.sample()
        present = slots[slots < k]
        present = present[included[present]]                    # null records: excluded canaries
        rows = dirs.gradients(present) * scale
        extra = int((slots >= k).sum())
        if extra and s.background == "random":
            rows = torch.cat([rows, _background(extra, d, s.clip_norm, rng)])
        grads = {"lora_A": rows[:, :half], "lora_B": rows[:, half:]}
        update = mech(grads, clip_norm=s.clip_norm, noise_multiplier=s.sigma,
                      expected_batch=s.expected_batch, noise=noise)
        flat = torch.cat([update["lora_A"], update["lora_B"]])
        rounds[t] = dirs.project(flat.numpy()) * units
        theta.grad = flat.to(theta.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
    final = -dirs.project(theta.detach().numpy())
    return Observation(included, rounds, final, time.perf_counter() - start)


__all__ = ["BROKEN", "MECHANISMS", "AuditSetup", "Observation", "simulate"]
