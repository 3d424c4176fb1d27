"""DP-GRPO training: Algorithm 1 of the paper as one loop over T public rounds.

    for t in 1..T:
        charge the round to the privacy journal                     (invariant 5)
        S_t  <- Poisson(q) sample of the n public slots             line 2
        for each sampled prompt: G completions, verifier rewards    lines 4-5
        per-prompt loss (Eq. 7) and ONE gradient per prompt         line 6
        clip each to C, sum, add N(0, sigma^2 C^2 I), divide by q n lines 7-8
        AdamW step on the LoRA parameters (skipped if non-finite)   line 9
        checkpoint every k rounds: release/ and recovery/

Arms differ only in how a sampled record becomes a :class:`~dpgrpo.objectives.TrainBatch`
(:mod:`dpgrpo.arms`) and in sigma and C; the mechanism, the accountant and the loop are shared.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from dpgrpo.arms import make_arm
from dpgrpo.checkpoint import PrivacyJournal, atomic_write_json, load_recovery, restore_adapter
from dpgrpo.checkpoint import save_recovery, write_release
from dpgrpo.config import RunConfig, config_from_dict, to_toml
from dpgrpo.distributed import barrier, broadcast_object, init_from_env, privatize_across_ranks, shard
from dpgrpo.errors import ConfigError
from dpgrpo.grads import per_prompt_grads, trainable_parameters
from dpgrpo.privacy.accounting import pld_epsilon
from dpgrpo.run_setup import RunState, build_run, certificate
from dpgrpo.runtime import bound_heap_growth

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    release_dir: Path
    certificate: dict[str, Any]
    rounds_done: int
    steps_skipped: int


def train(config: RunConfig | None, output_dir: str | Path, *, resume: bool = False,
          progress: ProgressFn | None = None, stop_after: int | None = None,
          show_private: bool = False) -> TrainResult:
    """Run (or resume) Algorithm 1 and write ``output_dir/release`` and ``output_dir/recovery``.

    ``progress`` receives public values only (round, steps, epsilon, elapsed seconds) unless
    ``show_private``, which adds the round's realized batch size and mean reward (invariant 6).

    ``stop_after`` ends the loop after that many rounds of this invocation without the final
    checkpoint, as an interruption would (used by tests of resume).
    """
    bound_heap_growth()  # memory set by the pass size, not by the number of passes so far
    run_dir = Path(output_dir)
    if resume:
        config = _resumed_config(run_dir)
    elif config is None:
        raise ConfigError("train() needs a config unless resume=True")
    elif (run_dir / "recovery" / "journal.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run; resume it with --resume or choose "
                          "another --output-dir")
    ctx = init_from_env()  # torchrun: one process per GPU; a single process otherwise
    run = build_run(config, run_dir, ctx)
    start = _restore(run) if resume else 0
    if not resume and ctx.is_main:
        atomic_write_text_config(run)
    arm = make_arm(run)
    journal = PrivacyJournal(run_dir / "recovery" / "journal.jsonl")
    q, sigma, clip = run.q, run.sigma, run.clip_norm
    skipped = run.steps_skipped
    steps = config.train.steps
    done_here = 0
    started = time.perf_counter()

    for t in range(start, steps):
        if ctx.is_main:
            journal.charge(t, q, sigma)                               # before touching data
        tic = time.perf_counter()
        sampled = broadcast_object(run.sampler.sample() if ctx.is_main else None, ctx)  # line 2
        records = [run.slots[i] for i in sampled if run.slots[i] is not None]  # absent: zero
        records = shard(records, ctx)                                 # this rank's prompts
        batch, info = arm.batch(records, run.rollout_generator())     # lines 4-6 (objective)
        grads = per_prompt_grads(run.model, arm.objective, batch.to(run.device),
                                 method=config.train.grad_method,
                                 rows_per_pass=config.train.rows_per_pass(arm.cap))  # line 6
        update = privatize_across_ranks(grads, clip_norm=clip, noise_multiplier=sigma,
                                        expected_batch=run.expected_batch, noise=run.noise,
                                        ctx=ctx)                      # lines 7-8
        if update.finite:                                             # line 9
            _apply(run, update.update)
        else:
            skipped += 1                                              # still charged
        run.telemetry.append({"round": t + 1, "batch_size": update.num_records, **info,
                              "nonfinite_records": update.num_nonfinite,
                              "clipped_records": update.num_clipped,
                              "step_skipped": not update.finite,
                              "seconds": time.perf_counter() - tic})
        done_here += 1
        if progress is not None and ctx.is_main:
            public = {"round": t + 1, "steps": steps, "epsilon": _epsilon_so_far(journal, run),
                      "elapsed": time.perf_counter() - started}
            private = {"batch_size": update.num_records, "reward_mean": info.get("reward_mean")}
            progress({**public, **private} if show_private else public)
        if (t + 1) % config.train.checkpoint_every == 0 or t + 1 == steps:
            run.steps_skipped = skipped
            if ctx.is_main:
                _checkpoint(run, journal, t + 1)
            barrier(ctx)
        if stop_after is not None and done_here >= stop_after and t + 1 < steps:
            return TrainResult(run_dir, run_dir / "release", {}, t + 1, skipped)  # "crash"
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    return TrainResult(run_dir, run_dir / "release", cert, steps, skipped)


def _apply(run: RunState, update: dict[str, torch.Tensor]) -> None:
    """Use the privatized update as the gradient of an AdamW step (fp32 optimizer state)."""
    params = trainable_parameters(run.model)
    for name, param in params.items():
        param.grad = update[name].to(device=param.device, dtype=param.dtype)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)


def _epsilon_so_far(journal: PrivacyJournal, run: RunState) -> float:
    """A certified upper bound for the progress bar: PLD on a coarse (1e-2) pessimistic grid."""
    ledger = journal.ledger()
    if not run.config.private:
        return math.inf
    return pld_epsilon(ledger.events, run.delta, value_discretization_interval=1e-2)


def _checkpoint(run: RunState, journal: PrivacyJournal, round_done: int) -> None:
    ledger = journal.ledger()
    save_recovery(run.run_dir / "recovery", round_done, model=run.model, optimizer=run.optimizer,
                  generators=run.generator_states(),
                  extra={"steps_skipped": run.steps_skipped, "ledger": ledger.to_dict()})
    telemetry = run.run_dir / "recovery" / "telemetry.jsonl"
    with open(telemetry, "a") as fh:
        for row in run.telemetry:
            fh.write(json.dumps(row) + "\n")
    run.telemetry.clear()
    atomic_write_json(run.run_dir / "recovery" / "ledger.json", ledger.to_dict())
    cert = certificate(run, ledger, round_done)
    write_release(run.run_dir / "release", model=run.model, config=run.config.to_dict(public=True),
                  certificate=cert)


def atomic_write_text_config(run: RunState) -> None:
    """The full config (seed included) goes to recovery/; release/ gets the public one later."""
    from dpgrpo.checkpoint import atomic_write_text

    atomic_write_json(run.run_dir / "recovery" / "config.json", run.config.to_dict(public=False))
    atomic_write_text(run.run_dir / "recovery" / "config.toml", to_toml(run.config))


def _resumed_config(run_dir: Path) -> RunConfig:
    path = run_dir / "recovery" / "config.json"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a dpgrpo run directory (no recovery/config.json)")
    data = json.loads(path.read_text())
    return config_from_dict(data, source=str(path))


def _restore(run: RunState) -> int:
    """Restore adapter, optimizer and generators from recovery/; return the next round index."""
    state = load_recovery(run.run_dir / "recovery")
    if state is None:
        return 0  # interrupted before the first checkpoint: start over (rounds stay charged)
    restore_adapter(run.model, state["adapter"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.load_generator_states(state["generators"])
    run.steps_skipped = int(state.get("steps_skipped", 0))
    return int(state["round_done"])


__all__ = ["TrainResult", "train"]
