"""Data-parallel DP-GRPO over torch.distributed (``torchrun --nproc_per_node K -m dpgrpo train``).

The mechanism is unchanged; only where its pieces run:

* rank 0 draws the Poisson coins and broadcasts the sampled slot indices;
* each rank computes per-prompt gradients for its share of the sampled prompts
  (``records[rank::world]``), sanitizes and clips each one, and sums them;
* the clipped sums are all-reduced (SUM); clipping happened per prompt before any reduction, so
  the sensitivity of the total is still C;
* rank 0 adds N(0, sigma^2 C^2 I) once and divides by q*n, then broadcasts the update, so every
  rank applies the same step and the noise is drawn exactly once per round;
* only rank 0 writes the journal, checkpoints and the release.

With one process every function here reduces to the single-process code path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence, TypeVar

import torch

from dpgrpo.privacy.mechanism import (
    PrivatizedUpdate,
    check_expected_batch,
    clip_sum_count,
    noise_and_scale,
)
from dpgrpo.privacy.noise import NoiseSource

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init_from_env() -> DistContext:
    """Join the process group torchrun describes in the environment (no-op for one process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return DistContext(dist.get_rank(), dist.get_world_size(), local)


def device_for(ctx: DistContext, requested: torch.device) -> torch.device:
    """Each rank uses its own GPU under torchrun."""
    if ctx.active and requested.type == "cuda":
        return torch.device("cuda", ctx.local_rank)
    return requested


def broadcast_object(obj: T, ctx: DistContext) -> T:
    """Rank 0's ``obj`` on every rank."""
    if not ctx.active:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def shard(items: Sequence[T], ctx: DistContext) -> list[T]:
    """This rank's share of the round's sampled records."""
    return list(items[ctx.rank::ctx.world_size])


def privatize_across_ranks(grads: dict[str, torch.Tensor], *, clip_norm: float,
                           noise_multiplier: float, expected_batch: float, noise: NoiseSource,
                           ctx: DistContext) -> PrivatizedUpdate:
    """The mechanism of :mod:`dpgrpo.privacy.mechanism` for records spread over ranks.

    The same two halves as :func:`~dpgrpo.privacy.mechanism.privatize`, with the transport
    between them: each rank's :func:`clip_sum_count`, an all-reduce of the sums and counts, and
    :func:`noise_and_scale` on rank 0 alone (noise exactly once), broadcast to every rank.
    """
    check_expected_batch(expected_batch)                         # on every rank, before work
    part = clip_sum_count(grads, clip_norm)                      # this rank's clipped records
    counts = (part.num_records, part.num_nonfinite, part.num_clipped)
    total = part.total
    if ctx.active:
        import torch.distributed as dist

        reduced = torch.tensor(counts, dtype=torch.float64,
                               device=next(iter(total.values())).device)
        for name in sorted(total):
            dist.all_reduce(total[name], op=dist.ReduceOp.SUM)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        counts = tuple(int(x) for x in reduced.tolist())
    if ctx.is_main:                                              # noise exactly once
        update = noise_and_scale(total, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                 expected_batch=expected_batch, noise=noise)
    else:
        update = {k: torch.empty_like(v) for k, v in total.items()}
    if ctx.active:
        import torch.distributed as dist

        for name in sorted(update):
            dist.broadcast(update[name], src=0)
    return PrivatizedUpdate(update, *counts)


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistContext", "barrier", "broadcast_object", "device_for", "init_from_env",
           "privatize_across_ranks", "shard"]
