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
    add_gaussian_noise,
    clip_and_sum,
    nonfinite_records,
    num_records,
    per_record_norms,
    privatize,
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
    """:func:`~dpgrpo.privacy.mechanism.privatize` for records spread over ranks."""
    if not ctx.active:
        return privatize(grads, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                         expected_batch=expected_batch, noise=noise)
    import torch.distributed as dist

    summed = clip_and_sum(grads, clip_norm)                      # this rank's clipped records
    any_tensor = next(iter(summed.values()))
    norms = per_record_norms(grads)
    counts = torch.tensor([num_records(grads), int(nonfinite_records(grads).sum()),
                           int((norms > clip_norm).sum()) if clip_norm != float("inf") else 0],
                          dtype=torch.float64, device=any_tensor.device)
    for name in sorted(summed):
        dist.all_reduce(summed[name], op=dist.ReduceOp.SUM)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    if ctx.is_main:                                              # noise exactly once
        noise.start_round()
        noisy = add_gaussian_noise(summed, noise_multiplier, clip_norm, noise)
        update = {k: v / expected_batch for k, v in noisy.items()}
    else:
        update = {k: torch.empty_like(v) for k, v in summed.items()}
    for name in sorted(update):
        dist.broadcast(update[name], src=0)
    b, bad, clipped = (int(x) for x in counts.tolist())
    return PrivatizedUpdate(update, b, bad, clipped)


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistContext", "barrier", "broadcast_object", "device_for", "init_from_env",
           "privatize_across_ranks", "shard"]
