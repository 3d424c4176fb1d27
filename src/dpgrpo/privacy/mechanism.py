"""The Gaussian mechanism over per-prompt gradients (Algorithm 1, lines 7-9; Appendix A-A).

Pure functions over one gradient type, :data:`PerRecordGrads`: a mapping from parameter name to
that parameter's per-record gradients ``(B, *param_shape)``, the record axis first (a single
tensor ``g`` is the mapping ``{"w": g}``). A record is one prompt with all of its completions,
so each record's gradient already sums its G completions. Sums and updates are :data:`Grads`,
name -> ``param_shape``, in the same order.

    g_bar_i = g_i * min(1, C / ||g_i||_2)          (Eq. 4; the norm is joint over all tensors)
    U       = sum_i g_bar_i + z,  z ~ N(0, sigma^2 C^2 I)        (noise exactly once)
    g_hat   = U / (q n)                             (the public expected batch size)

Clipping runs in the gradients' work dtype (fp32, or fp64 for fp64 gradients); the sum is
accumulated in fp64, the noise (:mod:`dpgrpo.privacy.noise`, fp64, made on the CPU) is added to
that fp64 sum, and the update stays fp64 until the optimizer casts it to the parameters' dtype.

A record whose gradient has a non-finite entry is replaced by zero before clipping, by a fixed
rule that does not depend on any other record (assumption A2). A non-finite clipped sum or
noisy update (after the division by q n, which overflows when q n < 1) marks the update
non-finite (:attr:`PrivatizedUpdate.finite`) and the trainer skips its step (invariant 3); a
non-finite clipped sum always gives a non-finite noisy sum (inf + finite noise), so the bit is
a function of the mechanism's output only. This module is the only place in
dpgrpo where gradients of different records are combined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from dpgrpo.errors import PrivacyError
from dpgrpo.privacy.noise import NoiseSource

#: per-record gradients, the one gradient type through the mechanism: parameter name ->
#: (B, *param_shape), the same B for every name (training.grads.per_prompt_grads gives it)
PerRecordGrads = Mapping[str, torch.Tensor]
#: a clipped sum, a noisy sum or an update: parameter name -> param_shape (fp64)
Grads = dict[str, torch.Tensor]


def _named(grads: PerRecordGrads) -> Grads:
    """``grads`` as a dict, refusing what is not per-record gradients by name."""
    if isinstance(grads, torch.Tensor):
        raise TypeError("per-record gradients are a mapping name -> (B, ...) tensor; pass a "
                        "single tensor g as {'w': g}")
    if not grads:
        raise PrivacyError("per-record gradients are empty: no tensors to clip")
    return dict(grads)


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """Clipping and noise run in fp64 for fp64 gradients, otherwise in fp32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def num_records(grads: PerRecordGrads) -> int:
    """Size of the leading record axis (consistent across all tensors)."""
    d = _named(grads)
    sizes = {t.shape[0] if t.dim() > 0 else -1 for t in d.values()}
    if len(sizes) != 1 or -1 in sizes:
        raise PrivacyError(f"every tensor needs the same leading record axis; got sizes {sizes}")
    return sizes.pop()


def _rows(t: torch.Tensor) -> torch.Tensor:
    """View a per-record tensor as (B, d), also for B = 0 and for scalar records."""
    return t.reshape(t.shape[0], 1) if t.dim() == 1 else t.flatten(start_dim=1)


def per_record_norms(grads: PerRecordGrads) -> torch.Tensor:
    """Joint L2 norm of each record over all of its tensors, shape (B,), in the work dtype."""
    d = _named(grads)
    b = num_records(d)
    dtype = _work_dtype(next(iter(d.values())))
    sq = torch.zeros(b, dtype=dtype, device=next(iter(d.values())).device)
    for t in d.values():
        sq += _rows(t).to(dtype).pow(2).sum(dim=1)
    return sq.sqrt()


def nonfinite_records(grads: PerRecordGrads) -> torch.Tensor:
    """Boolean mask (B,) of records that have any NaN or infinite entry."""
    d = _named(grads)
    b = num_records(d)
    bad = torch.zeros(b, dtype=torch.bool, device=next(iter(d.values())).device)
    for t in d.values():
        bad |= ~torch.isfinite(_rows(t)).all(dim=1)
    return bad


def sanitize_nonfinite(grads: PerRecordGrads) -> tuple[Grads, torch.Tensor]:
    """Replace every non-finite record by the zero vector; returns (grads, mask of replaced)."""
    d = _named(grads)
    bad = nonfinite_records(d)
    out = {}
    for name, t in d.items():
        keep = (~bad).view(-1, *([1] * (t.dim() - 1)))
        out[name] = torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))
    return out, bad


def clip_per_record(grads: PerRecordGrads, clip_norm: float) -> Grads:
    """Scale each record to L2 norm at most C (Eq. 4), jointly over its tensors.

    ``clip_norm = inf`` disables clipping (non-private reference runs only).
    """
    if not clip_norm > 0:
        raise PrivacyError(f"clipping norm C must be > 0, got {clip_norm}")
    d = _named(grads)
    if math.isinf(clip_norm):
        return {k: v.to(_work_dtype(v)) for k, v in d.items()}
    norms = per_record_norms(d)
    # min(1, C / ||g||): records with zero norm get factor 1 (C / 0 = inf).
    factor = torch.clamp(clip_norm / norms, max=1.0)
    out = {}
    for name, t in d.items():
        shape = (-1,) + (1,) * (t.dim() - 1)
        out[name] = t.to(factor.dtype) * factor.view(shape)
    return out


def sum_records(grads: PerRecordGrads) -> Grads:
    """Sum over the record axis in fp64; an empty batch gives zeros of the parameter shapes."""
    d = _named(grads)
    return {k: v.sum(dim=0, dtype=torch.float64) for k, v in d.items()}


def add_gaussian_noise(summed: Grads, noise_multiplier: float, clip_norm: float,
                       noise: NoiseSource) -> Grads:
    """Add N(0, sigma^2 C^2 I) to the sum, once, to every coordinate of every tensor (line 8).

    The noise is fp64 from the CPU, drawn as one vector for all tensors (in their order) and
    moved to the sum's device once; the result is fp64. The caller starts the round
    (:meth:`NoiseSource.start_round`) first.
    """
    if noise_multiplier < 0:
        raise PrivacyError(f"noise multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier > 0 and math.isinf(clip_norm):
        raise PrivacyError("noise with an infinite clipping norm has infinite scale: a private "
                           "run needs a finite C, because sensitivity is bounded only by clipping")
    std = noise_multiplier * clip_norm if noise_multiplier > 0 else 0.0
    d = _named(summed)
    sizes = [v.numel() for v in d.values()]
    flat = noise.normal((sum(sizes),), std).to(next(iter(d.values())).device)
    return {k: v.to(torch.float64) + z.view(v.shape).to(v.device)
            for (k, v), z in zip(d.items(), flat.split(sizes))}


@dataclass(frozen=True)
class ClippedSum:
    """Lines 7-8 before the noise: the fp64 sum of clipped records and its private counts.

    This is what data-parallel ranks all-reduce (:class:`Reduce`): clipping happened per record
    before any reduction, so the sensitivity of the reduced total is still C.
    """

    total: Grads
    num_records: int
    num_nonfinite: int
    num_clipped: int


@dataclass(frozen=True)
class PrivatizedUpdate:
    """The noisy average gradient of one round and its (private) bookkeeping.

    ``update`` is safe to apply. ``num_records``, ``num_nonfinite`` and ``num_clipped`` are
    training-time telemetry computed from private data: they belong in ``recovery/`` only.
    """

    update: Grads
    num_records: int
    num_nonfinite: int
    num_clipped: int
    sum_finite: bool = True  # the clipped sum before the noise (every entry finite)

    @property
    def finite(self) -> bool:
        """False if the clipped sum or the noisy update (after the division by q n) has a
        non-finite entry (the trainer then skips the step)."""
        return self.sum_finite and all_finite(self.update)


def all_finite(tensors: Grads) -> bool:
    """Whether every entry of every tensor is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def check_expected_batch(expected_batch: float) -> None:
    """The denominator q*n must be a positive public number (never the realized batch size)."""
    if not expected_batch > 0:
        raise PrivacyError(f"the denominator q*n must be > 0, got {expected_batch}")


def clip_sum_count(grads: PerRecordGrads, clip_norm: float) -> ClippedSum:
    """Sanitize non-finite records to zero, clip each to C, sum in fp64, and count (lines 7-8)."""
    b = num_records(grads)
    clean, bad = sanitize_nonfinite(grads)
    norms = per_record_norms(clean)
    total = sum_records(clip_per_record(clean, clip_norm))
    clipped = int((norms > clip_norm).sum()) if math.isfinite(clip_norm) else 0
    return ClippedSum(total, b, int(bad.sum()), clipped)


def clip_and_sum(grads: PerRecordGrads, clip_norm: float) -> Grads:
    """The fp64 sum of sanitized, clipped records (:func:`clip_sum_count` without the counts)."""
    return clip_sum_count(grads, clip_norm).total


def noise_and_scale(total: Grads, *, clip_norm: float, noise_multiplier: float,
                    expected_batch: float, noise: NoiseSource) -> Grads:
    """Add N(0, sigma^2 C^2 I) once to the clipped sum and divide by the public q*n (lines 8-9).

    Starts the noise source's round (:meth:`NoiseSource.start_round`): call it exactly once per
    round, on one process.
    """
    check_expected_batch(expected_batch)
    noise.start_round()
    noisy = add_gaussian_noise(total, noise_multiplier, clip_norm, noise)
    return {k: v / expected_batch for k, v in noisy.items()}


class Reduce(Protocol):
    """The transport between the mechanism's two halves, for records spread over processes.

    ``total`` combines every process's :class:`ClippedSum` (clipping happened per record
    before, so the reduced total still has sensitivity C); only the process where
    ``adds_noise`` is true noises and scales it, exactly once; ``share`` gives its update to
    every process. :data:`LOCAL` is the one-process transport;
    :func:`dpgrpo.training.distributed.across_ranks` the torch.distributed one.
    """

    @property
    def adds_noise(self) -> bool: ...

    def total(self, part: ClippedSum) -> ClippedSum: ...

    def share(self, update: Grads) -> Grads: ...


class _Local:
    """One process holds every record: the identity transport."""

    adds_noise = True

    def total(self, part: ClippedSum) -> ClippedSum:
        return part

    def share(self, update: Grads) -> Grads:
        return update


LOCAL: Reduce = _Local()


def privatize(grads: PerRecordGrads, *, clip_norm: float, noise_multiplier: float,
              expected_batch: float, noise: NoiseSource, reduce: Reduce = LOCAL
              ) -> PrivatizedUpdate:
    """One round of the mechanism: :func:`clip_sum_count`, the transport ``reduce``, then
    :func:`noise_and_scale` on one process.

    Args:
        grads: per-prompt gradients, name -> (B, ...) (B possibly 0).
        clip_norm: C; ``inf`` only together with ``noise_multiplier = 0``.
        noise_multiplier: sigma (0 for non-private reference runs).
        expected_batch: the public q * n. Never pass the realized batch size: it depends on the
            data through the sampled presence bits and would void the analysis (Appendix A-G).
        noise: the round's noise source; :meth:`NoiseSource.start_round` is called here, on the
            process that adds the noise.
        reduce: where the other records are (:class:`Reduce`; default: all here).
    """
    check_expected_batch(expected_batch)                         # on every process, before work
    part = reduce.total(clip_sum_count(grads, clip_norm))
    if reduce.adds_noise:                                        # noise exactly once
        update = noise_and_scale(part.total, clip_norm=clip_norm,
                                 noise_multiplier=noise_multiplier,
                                 expected_batch=expected_batch, noise=noise)
    else:
        update = {k: torch.empty_like(v) for k, v in part.total.items()}
    update = reduce.share(update)
    return PrivatizedUpdate(update, part.num_records, part.num_nonfinite, part.num_clipped,
                            sum_finite=all_finite(part.total))
