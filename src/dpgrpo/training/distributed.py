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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from dpgrpo.privacy.mechanism import ClippedSum, Reduce

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


@dataclass(frozen=True)
class _Ranks:
    """The torch.distributed transport of :func:`~dpgrpo.privacy.mechanism.privatize`: an
    all-reduce (SUM) of the clipped sums and counts, noise on rank 0 alone, and a broadcast of
    rank 0's update, so every rank applies the same step."""

    ctx: DistContext

    @property
    def adds_noise(self) -> bool:
        return self.ctx.is_main

    def total(self, part: ClippedSum) -> ClippedSum:
        if not self.ctx.active:
            return part
        import torch.distributed as dist

        total = dict(part.total)
        counts = torch.tensor((part.num_records, part.num_nonfinite, part.num_clipped),
                              dtype=torch.float64, device=next(iter(total.values())).device)
        for name in sorted(total):
            dist.all_reduce(total[name], op=dist.ReduceOp.SUM)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        records, nonfinite, clipped = (int(x) for x in counts.tolist())
        return ClippedSum(total, records, nonfinite, clipped)

    def share(self, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.ctx.active:
            import torch.distributed as dist

            for name in sorted(update):
                dist.broadcast(update[name], src=0)
        return update


def across_ranks(ctx: DistContext) -> Reduce:
    """The transport between ranks for :func:`~dpgrpo.privacy.mechanism.privatize`
    (``reduce=across_ranks(ctx)``); with one process, the same as the single-process path."""
    return _Ranks(ctx)


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistContext", "across_ranks", "barrier", "broadcast_object", "device_for",
           "init_from_env", "shard"]
