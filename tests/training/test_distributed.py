"""Data-parallel training over torch.distributed (gloo, 2 CPU processes): the clipped sums are
all-reduced, noise is drawn once on rank 0, and every rank applies the same update."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from dpgrpo.privacy.mechanism import privatize
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.training.distributed import DistContext, across_ranks, init_from_env, shard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _records(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 4, 5, generator=g, dtype=torch.float64),
            "b": torch.randn(3, 7, generator=g, dtype=torch.float64)}


def _mechanism_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    _env(rank, world, port)
    ctx = init_from_env()
    grads = _records(rank)
    for sigma in (0.0, 1.5):
        up = privatize(grads, clip_norm=0.9, noise_multiplier=sigma, expected_batch=5.0,
                       noise=NoiseSource(seed=42), reduce=across_ranks(ctx))
        torch.save({"update": up.update, "records": up.num_records},
                   os.path.join(out_dir, f"mech-{sigma}-{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_all_reduce_then_noise_once_equals_single_process(tmp_path):
    port = _free_port()
    mp.spawn(_mechanism_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    union = {k: torch.cat([_records(0)[k], _records(1)[k]]) for k in _records(0)}
    for sigma in (0.0, 1.5):
        single = privatize(union, clip_norm=0.9, noise_multiplier=sigma, expected_batch=5.0,
                           noise=NoiseSource(seed=42)).update
        r0 = torch.load(tmp_path / f"mech-{sigma}-0.pt")
        r1 = torch.load(tmp_path / f"mech-{sigma}-1.pt")
        assert r0["records"] == r1["records"] == 6
        for k in single:
            assert torch.equal(r0["update"][k], r1["update"][k])  # every rank, same step
            assert torch.allclose(r0["update"][k], single[k], rtol=0, atol=1e-12)


def test_shard_partitions_records():
    items = list(range(7))
    parts = [shard(items, DistContext(r, 3)) for r in range(3)]
    assert sorted(x for part in parts for x in part) == items and parts[0] == [0, 3, 6]


def _train_worker(rank: int, world: int, port: int, model_dir: str, run_dir: str) -> None:
    _env(rank, world, port)
    from dpgrpo.config import apply_overrides, embedded_default
    from dpgrpo.training.trainer import train

    cfg = apply_overrides(embedded_default(), [
        f"model.name={model_dir}", "model.device=cpu", "data.limit=40", "privacy.expected_batch=8",
        "privacy.noise_multiplier=1.0", "train.rounds=2", "train.group_size=2",
        "train.max_new_tokens=5", "train.checkpoint_every=2"])
    seen = {}
    import dpgrpo.training.trainer as trainer

    original = trainer.build_run

    def keep(config, path, ctx=None):
        seen["run"] = original(config, path, ctx)
        return seen["run"]

    trainer.build_run = keep
    # What each rank sampled and processed, and the round key it used (issue 32, mutation c).
    from dpgrpo.privacy.record_coins import PromptCoins
    from dpgrpo.privacy.sampling import PoissonSampler

    log = {"sampled": [], "mine": [], "keys": []}
    real_sample = PoissonSampler.sample

    def sample(self):
        out = real_sample(self)
        log["sampled"].append([int(i) for i in out])
        return out

    class Spy:
        @staticmethod
        def for_records(key, slots, bounds):
            log["mine"].append([int(s) for s in slots])
            log["keys"].append(key.key.hex())
            return PromptCoins.for_records(key, slots, bounds)

    PoissonSampler.sample = sample
    trainer.PromptCoins = Spy
    train(cfg, run_dir)
    with open(os.path.join(os.path.dirname(run_dir), f"rounds-{rank}.json"), "w") as f:
        json.dump(log, f)
    adapter = {k: v.detach().clone() for k, v in seen["run"].model.named_parameters()
               if v.requires_grad}
    torch.save(adapter, os.path.join(os.path.dirname(run_dir), f"adapter-{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_torchrun_style_training_writes_one_release(tiny_model_dir, tmp_path):
    port = _free_port()
    run_dir = tmp_path / "run"
    mp.spawn(_train_worker, args=(2, port, str(tiny_model_dir), str(run_dir)), nprocs=2, join=True)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert cert["rounds_charged"] == 2 and cert["n"] == 40 and cert["q"] == pytest.approx(0.2)
    journal = (run_dir / "recovery" / "journal.jsonl").read_text().splitlines()
    assert len(journal) == 2  # charged once per round, by rank 0 only
    a0, a1 = torch.load(tmp_path / "adapter-0.pt"), torch.load(tmp_path / "adapter-1.pt")
    assert a0.keys() == a1.keys() and all(torch.equal(a0[k], a1[k]) for k in a0)
    assert any(float(v.abs().sum()) > 0 for k, v in a0.items() if "lora_B" in k)
    # One Poisson sample per round, drawn on rank 0 only and split between the ranks: no
    # record processed twice, none dropped, and both ranks on the same round key.
    r0, r1 = (json.loads((tmp_path / f"rounds-{r}.json").read_text()) for r in (0, 1))
    assert len(r0["sampled"]) == 2 and r1["sampled"] == []       # rank 1 never draws coins
    for t, sampled in enumerate(r0["sampled"]):
        mine0, mine1 = r0["mine"][t], r1["mine"][t]
        assert not set(mine0) & set(mine1) and sorted(mine0 + mine1) == sampled
        assert r0["keys"][t] == r1["keys"][t]
    assert r0["keys"][0] != r0["keys"][1]


def test_one_process_transport_is_the_mechanism_and_guards_the_denominator():
    grads = _records(3)
    ctx = DistContext()
    for sigma in (0.0, 1.5):
        here = privatize(grads, clip_norm=0.9, noise_multiplier=sigma, expected_batch=5.0,
                         noise=NoiseSource(seed=7), reduce=across_ranks(ctx))
        ref = privatize(grads, clip_norm=0.9, noise_multiplier=sigma, expected_batch=5.0,
                        noise=NoiseSource(seed=7))
        assert (here.num_records, here.num_clipped) == (ref.num_records, ref.num_clipped) == (3, 3)
        for k in ref.update:
            assert torch.equal(here.update[k], ref.update[k])
    from dpgrpo.errors import PrivacyError

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(PrivacyError, match="q\\*n"):
            privatize(grads, clip_norm=0.9, noise_multiplier=1.0, expected_batch=bad,
                      noise=NoiseSource(seed=7), reduce=across_ranks(ctx))


def test_distributed_transport_reuses_the_mechanism_halves():
    """Noise, its scale and the division by q*n live in mechanism.py only (issue 13.1)."""
    import inspect

    import dpgrpo.training.distributed as dist_mod

    src = inspect.getsource(dist_mod)
    for name in ("add_gaussian_noise", "clip_per_record", "/ expected_batch", "normal(",
                 "noise_and_scale", "clip_sum_count", "start_round"):
        assert name not in src
    assert "all_reduce" in src and "broadcast" in src  # a transport, nothing more


# --- issue 56, M16: the noise of a multi-process round is N(0, sigma^2 C^2), not less -------

SIGMA_M16, CLIP_M16, QN_M16 = 1.3, 0.5, 8.0


def _noise_worker(rank: int, world: int, port: int, model_dir: str, run_dir: str) -> None:
    """A real W-rank training run whose per-prompt gradients are zeroed just before the
    mechanism, so that each round's update is the noise rank 0 drew, divided by q*n."""
    _env(rank, world, port)
    import dpgrpo.training.trainer as trainer
    from dpgrpo.config import apply_overrides, embedded_default

    cfg = apply_overrides(embedded_default(), [
        f"model.name={model_dir}", "model.device=cpu", "data.limit=40",
        f"privacy.expected_batch={QN_M16}", f"privacy.noise_multiplier={SIGMA_M16}",
        f"privacy.clip_norm={CLIP_M16}", "train.rounds=2", "train.group_size=2",
        "train.max_new_tokens=3", "train.checkpoint_every=2"])
    original, drawn = trainer.privatize, []

    def zero_records(grads, **kwargs):  # the trainer's sigma, C, q*n, noise and transport
        zeros = {k: torch.zeros_like(v) for k, v in grads.items()}
        up = original(zeros, **kwargs)
        drawn.append(torch.cat([v.detach().flatten().double() for v in up.update.values()]))
        return up

    trainer.privatize = zero_records
    trainer.train(cfg, run_dir)
    torch.save(drawn, os.path.join(os.path.dirname(run_dir), f"noise-{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_rank_zero_draws_the_full_noise_in_a_multi_process_run(tiny_model_dir, tmp_path, world):
    """The noise std of a W-rank round is sigma*C: the clipped sum has sensitivity C whatever W
    is, so sigma / sqrt(W) per rank (or on rank 0) would be sqrt(W) too little (M16)."""
    port = _free_port()
    run_dir = tmp_path / "run"
    mp.spawn(_noise_worker, args=(world, port, str(tiny_model_dir), str(run_dir)), nprocs=world,
             join=True)
    updates = [torch.load(tmp_path / f"noise-{r}.pt") for r in range(world)]
    assert len(updates[0]) == 2 and all(len(u) == 2 for u in updates)
    for rank in range(1, world):  # rank 0's draw, applied by every rank
        assert all(torch.equal(a, b) for a, b in zip(updates[0], updates[rank]))
    z = torch.cat(updates[0]) * QN_M16      # the noise before the division by q*n
    n, std = z.numel(), SIGMA_M16 * CLIP_M16
    assert n >= 1000
    # mean(z^2) / (sigma C)^2 of n iid N(0, (sigma C)^2) draws has sd sqrt(2/n): within 6 sd
    # (a false failure ~1e-9), far from the 1/W that sigma / sqrt(W) would give
    ratio = float(z.pow(2).mean()) / std**2
    assert abs(ratio - 1) < 6 * (2 / n) ** 0.5 < (1 - 1 / world) / 2, (ratio, n)
    assert abs(float(z.mean())) < 6 * std / n**0.5
