"""DP-GRPO training: Algorithm 1 of the paper as one loop over T public rounds.

    for t in 1..T:
        charge the round to the privacy journal                     (invariant 5)
        S_t  <- Poisson(q) sample of the n public slots             line 2
                (contributor-level DP: a slot is a contributor, who brings <= k problems)
        for each sampled prompt: G completions, verifier rewards    lines 4-5
        per-prompt loss (Eq. 7) and ONE gradient per prompt         line 6
                (contributor-level DP: summed over the contributor's own prompts)
        clip each to C, sum, add N(0, sigma^2 C^2 I), divide by q n lines 7-8
        AdamW step on the LoRA parameters (skipped if non-finite)   line 9
                (the update, its fp32 cast and the weights after the step: invariant 3)
        checkpoint every k rounds: release/ and recovery/

The loop is :func:`_train`: :func:`open_run` builds (or restores) the run, :func:`run_round` is
one round above, :func:`finish` closes it. Arms differ only in how a sampled record becomes a
:class:`~dpgrpo.objectives.TrainBatch` (:mod:`dpgrpo.training.arms`) and in sigma and C; the
mechanism, the accountant and the loop are shared.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from dpgrpo.config import RunConfig, to_toml
from dpgrpo.config.json_types import JSON
from dpgrpo.config.values import check_weights
from dpgrpo.errors import ConfigError, UserCodeError
from dpgrpo.privacy.accounting import epsilon
from dpgrpo.privacy.contributors import round_prompts, sum_within_records
from dpgrpo.privacy.journal import PrivacyJournal
from dpgrpo.privacy.mechanism import PrivatizedUpdate, privatize
from dpgrpo.privacy.record_coins import PromptCoins, RoundKey
from dpgrpo.release.certificate import certificate
from dpgrpo.release.write import write_release
from dpgrpo.rundir.atomic import (
    append_lines,
    atomic_write_json,
    atomic_write_text,
    private_tree,
)
from dpgrpo.rundir.checkpoint import (
    checkpoint_dirs,
    load_checkpoint,
    remove_temporaries,
    restore_adapter,
    save_recovery,
)
from dpgrpo.rundir.layout import RunDir
from dpgrpo.rundir.lock import RunLock
from dpgrpo.rundir.resume import (
    check_charged,
    gather_evidence,
    read_run_config,
    reconcile,
    release_is_current,
)
from dpgrpo.training.arms import Arm, make_arm
from dpgrpo.training.distributed import (
    DistContext,
    across_ranks,
    barrier,
    broadcast_object,
    init_from_env,
    shard,
)
from dpgrpo.training.grads import per_prompt_grads, trainable_parameters
from dpgrpo.training.metrics import MetricsLogger, open_metrics
from dpgrpo.training.quiet import quiet_model_loading
from dpgrpo.training.runtime import bound_heap_growth, release_free_memory
from dpgrpo.training.setup import RunState, build_run

log = logging.getLogger(__name__)

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    release_dir: Path
    certificate: JSON
    rounds_done: int
    steps_skipped: int
    notes: tuple[str, ...] = ()  # what resume repaired (charged lost rounds, fell back, ...)


def train(config: RunConfig | None, output_dir: str | Path, *, resume: bool = False,
          progress: ProgressFn | None = None, stop_after: int | None = None,
          show_private: bool = False) -> TrainResult:
    """Run (or resume) Algorithm 1 and write ``output_dir/release`` and ``output_dir/recovery``.

    ``progress`` receives public values only (round, rounds, epsilon, elapsed seconds) unless
    ``show_private``, which adds the round's realized batch size and mean reward (invariant 6).

    One process writes a run at a time (:class:`~dpgrpo.rundir.lock.RunLock`); a second one gets
    :class:`~dpgrpo.errors.RunLockedError`. A fresh run that fails before its first round is
    charged leaves no run directory behind. ``stop_after`` ends the loop after that many rounds
    of this invocation without the final checkpoint, as an interruption would (used by tests
    of resume).
    """
    run_dir = Path(output_dir)
    ctx = init_from_env()  # torchrun: one process per GPU; a single process otherwise
    if not ctx.is_main:
        return _train(config, run_dir, ctx, resume, progress, stop_after, show_private)
    created = _first_missing(run_dir)
    made_recovery = not RunDir(run_dir).recovery.exists()
    with RunLock(run_dir):
        try:
            return _train(config, run_dir, ctx, resume, progress, stop_after, show_private)
        except BaseException:
            if not resume:
                _remove_failed_start(run_dir, created, made_recovery)
            raise


@dataclass
class OpenRun:
    """A run ready for its next round: what every round reads, and where the loop starts."""

    run: RunState
    ctx: DistContext
    journal: PrivacyJournal
    arm: Arm
    metrics: MetricsLogger | None
    start: int                    # the next round index (0, or the checkpoint's on resume)
    notes: list[str]              # what resume repaired
    started: float = field(default_factory=time.perf_counter)

    @property
    def config(self) -> RunConfig:
        return self.run.config


@dataclass(frozen=True)
class RoundOutcome:
    """What one round leaves for the loop (its private telemetry row went to the run)."""

    done: int                     # rounds done after it (t + 1)
    update: PrivatizedUpdate
    info: dict[str, Any]          # the arm's private statistics (reward mean, lengths)
    timings: dict[str, float]     # wall-clock per phase: private unless train.public_timings


def _train(config: RunConfig | None, run_dir: Path, ctx: DistContext, resume: bool,
           progress: ProgressFn | None, stop_after: int | None,
           show_private: bool = False) -> TrainResult:
    live = open_run(config, run_dir, ctx, resume)
    rounds = live.config.train.rounds
    for t in range(live.start, rounds):
        outcome = run_round(live, t)
        _report(live, outcome, progress, show_private)
        if outcome.done % live.config.train.checkpoint_every == 0 or outcome.done == rounds:
            if ctx.is_main:
                _checkpoint(live.run, live.journal, outcome.done)
            barrier(ctx)
        stop = stop_after is not None and outcome.done - live.start >= stop_after
        if stop and outcome.done < rounds:
            return finish(live, outcome.done, interrupted=True)  # as a crash would
    return finish(live, rounds)


def open_run(config: RunConfig | None, run_dir: Path, ctx: DistContext,
             resume: bool) -> OpenRun:
    """Build the run (model, sampler, noise, journal), restore it on resume, open its sinks."""
    if ctx.is_main:
        for name in remove_temporaries(run_dir):
            log.warning("%s: removed %s left by an interrupted write", run_dir, name)
        private_tree(RunDir(run_dir).recovery)  # 0700/0600 before any private write
    if resume:
        config = read_run_config(run_dir)
    elif config is None:
        raise ConfigError("train() needs a config unless resume=True")
    elif _holds_run(run_dir):
        raise ConfigError(f"{run_dir} already holds a run; resume it with --resume or choose "
                          "another --out")
    if config.train.bound_memory:
        bound_heap_growth()  # memory set by the pass size, not by the number of passes so far
    with quiet_model_loading():
        run = build_run(config, run_dir, ctx)
    check_weights(getattr(run.task, "reward_weights", None),  # before any round is charged
                  f"task {run.task.name!r}: reward_weights")
    journal = PrivacyJournal(run.layout.journal, run.q, run.sigma, twin=run.layout.journal_twin)
    notes: list[str] = []
    if resume:
        start = _restore(run, journal, ctx, notes)
    else:
        start = 0
        if ctx.is_main:
            _write_recovery_config(run)
            journal.open()
    metrics = (open_metrics(config.train.metrics, run_dir, config.to_dict(public=True),
                            timings=config.train.public_timings, releasable=config.releasable)
               if ctx.is_main else None)
    return OpenRun(run, ctx, journal, make_arm(config, run.policy, run.task), metrics, start,
                   notes)


def run_round(live: OpenRun, t: int) -> RoundOutcome:
    """Round t + 1 of Algorithm 1, charged before it touches data."""
    run, ctx, arm, laps = live.run, live.ctx, live.arm, live.arm.laps
    if ctx.is_main:
        live.journal.charge(t, run.q, run.sigma)                      # before touching data
    tic = time.perf_counter()
    # broadcast_object returns rank 0's value (never None) on every rank
    sampled = cast(np.ndarray,
                   broadcast_object(run.sampler.sample() if ctx.is_main else None, ctx))  # line 2
    mine = shard([int(i) for i in sampled if run.slots[i] is not None], ctx)  # absent: zero
    records = [run.slots[i] for i in mine]                            # this rank's records
    key = cast(RoundKey, broadcast_object(run.coins.round_key(t) if ctx.is_main else None, ctx))
    laps.reset()
    plan = round_prompts(records, run.chooser,                        # a contributor: <= k
                         [key.reader(s, 0, "choose") for s in mine])
    coins = PromptCoins.for_records(key, mine, plan.bounds)           # bound to (round, slot)
    try:
        batch, info = arm.batch(plan.prompts, coins=coins)            # lines 4-6 (objective)
    except UserCodeError as err:  # the round is charged (journal): the run stays resumable
        raise UserCodeError(f"round {t + 1}: {err}; round {t + 1} stays charged to the "
                            f"privacy ledger; fix it, then: dpgrpo train --resume "
                            f"{run.run_dir}") from None
    grads = per_prompt_grads(run.model, arm.objective, batch.to(run.device),
                             method=grad_method(run.config),
                             rows_per_pass=run.config.train.pass_rows(arm.cap),
                             dropout_seeds=coins.seeds("dropout"))    # line 6
    grads = sum_within_records(grads, plan)                           # one gradient per record
    laps.mark("gradients")
    update = privatize(grads, clip_norm=run.clip_norm, noise_multiplier=run.sigma,
                       expected_batch=run.expected_batch, noise=run.noise,
                       reduce=across_ranks(ctx))                      # lines 7-8
    laps.mark("mechanism")
    update_norm = None
    if update.finite:                                                 # line 9
        update_norm = apply_update(run.model, run.optimizer, update.update,
                                   max_norm=run.config.train.max_update_norm)
    skipped = update_norm is None                                     # invariant 3
    run.steps_skipped += int(skipped)                                 # still charged
    laps.mark("step")
    timings = {"time/round": time.perf_counter() - tic, **laps.row()}  # private by default
    run.telemetry.append({"round": t + 1, "batch_size": update.num_records,
                          "prompts": len(plan.prompts), **info,
                          "nonfinite_records": update.num_nonfinite,
                          "clipped_records": update.num_clipped,
                          "step_skipped": skipped, "update_norm": update_norm,
                          "seconds": timings["time/round"], **timings})
    release_free_memory()                                             # RSS back to baseline
    return RoundOutcome(t + 1, update, info, timings)


def _report(live: OpenRun, outcome: RoundOutcome, progress: ProgressFn | None,
            show_private: bool) -> None:
    """Public values to the progress callback and the metrics sinks (invariant 6)."""
    if (progress is None and live.metrics is None) or not live.ctx.is_main:
        return
    config = live.config
    public = {"round": outcome.done, "rounds": config.train.rounds,
              "epsilon": _epsilon_so_far(live.journal, config.private, live.run.delta),
              "elapsed": time.perf_counter() - live.started}
    if live.metrics is not None:                                      # public values only
        live.metrics.log({k: public[k] for k in ("round", "rounds", "epsilon")}
                         | (outcome.timings | {"elapsed": public["elapsed"]}
                            if config.train.public_timings else {}))
    private = {"batch_size": outcome.update.num_records,
               "reward_mean": outcome.info.get("reward_mean")}
    if progress is not None:
        progress({**public, **private} if show_private else public)


def finish(live: OpenRun, rounds_done: int, *, interrupted: bool = False) -> TrainResult:
    """Close the sinks; the result carries the release's certificate (none when interrupted)."""
    if live.metrics is not None:
        live.metrics.close()
    layout = live.run.layout
    cert = {} if interrupted else json.loads(layout.certificate_path.read_text())
    return TrainResult(live.run.run_dir, layout.release, cert, rounds_done,
                       live.run.steps_skipped, tuple(live.notes))


def grad_method(config: RunConfig) -> str:
    """``train.grad_method``, with ``auto`` resolved: the hook path, or the reference path when
    gradient checkpointing is on (the hooks' stashes would defeat it) or only some layers are
    adapted (both paths then skip the backward below the first adapted layer, and on the CPU
    study's adapter they take the same time: 24.7/25.4 s against 25.2/23.6 s for 4 prompts x
    G 6, 2026-12-02, under load; the hook path from the embeddings took 45.6/38.9 s)."""
    if config.train.grad_method != "auto":
        return config.train.grad_method
    lean = config.model.gradient_checkpointing or config.model.lora_layers is not None
    return "reference" if lean else "fast"


def apply_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 update: dict[str, torch.Tensor], *, max_norm: float | None = None) -> float | None:
    """Use the privatized update as the gradient of an AdamW step (fp32 optimizer state),
    its norm clipped to ``max_norm`` first (post-processing); returns the norm before it.

    Invariant 3 where an overflow can happen: the norm of the update cast to the parameters'
    dtype (fp64 1e308 is inf in fp32; a NaN or inf entry makes it non-finite) and the weights
    after the step (AdamW squares the gradient). A non-finite one skips the step (None; the
    weights and AdamW state as before). The rule reads only the noisy update and what follows
    from it (post-processing, no privacy cost)."""
    params = trainable_parameters(model)
    for name, param in params.items():
        param.grad = update[name].to(device=param.device, dtype=param.dtype)
    norm = float(torch.nn.utils.clip_grad_norm_(      # inf: measures, scales by 1
        params.values(), math.inf if max_norm is None else max_norm))
    stepped = math.isfinite(norm) and _step_or_undo(optimizer, list(params.values()))
    optimizer.zero_grad(set_to_none=True)
    return norm if stepped else None


def _step_or_undo(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> bool:
    """One optimizer step, undone (weights and optimizer state put back) if it made a weight
    non-finite; the copy kept for that is the trainable weights and their state (a few
    adapters' worth). Returns whether the step stands."""
    weights = [p.detach().clone() for p in params]
    state = {p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
             for p, s in optimizer.state.items()}
    try:
        optimizer.step()
    except RuntimeError as err:                       # a step size past fp32's range
        if "overflow" not in str(err):
            raise
    else:
        if all(bool(p.isfinite().all()) for p in params):
            return True
    with torch.no_grad():
        for param, saved in zip(params, weights):
            param.copy_(saved)
    optimizer.state.clear()                           # a parameter without state before
    optimizer.state.update(state)                     # (the first step) has none again
    return False


def _epsilon_so_far(journal: PrivacyJournal, private: bool, delta: float) -> float:
    """A certified upper bound for the progress bar: PLD on a coarse (1e-2) pessimistic grid."""
    ledger = journal.ledger()
    if not private:
        return math.inf
    return epsilon(ledger, delta, value_discretization_interval=1e-2)


def _checkpoint(run: RunState, journal: PrivacyJournal, round_done: int) -> None:
    ledger = journal.ledger()
    check_charged(ledger.rounds, round_done, str(run.layout.recovery))
    save_recovery(run.layout.recovery, round_done, model=run.model,
                  optimizer=run.optimizer, generators=run.generator_states(),
                  extra={"steps_skipped": run.steps_skipped, "ledger": ledger.to_dict()})
    append_lines(run.layout.telemetry,
                 [json.dumps(row) for row in run.telemetry])
    run.telemetry.clear()
    _publish(run, journal, round_done)


def _publish(run: RunState, journal: PrivacyJournal, round_done: int) -> None:
    """ledger.json and the release of the model as it is after ``round_done`` rounds."""
    ledger = journal.ledger()
    check_charged(ledger.rounds, round_done, str(run.layout.release))
    atomic_write_json(run.layout.ledger, ledger.to_dict())
    cert = certificate(run, ledger, round_done)
    write_release(run.layout.release, model=run.model,
                  config=run.config.to_dict(public=True), certificate=cert)


def _write_recovery_config(run: RunState) -> None:
    """The full config (seed included) goes to recovery/; release/ gets the public one later."""
    atomic_write_json(run.layout.config_json, run.config.to_dict(public=False))
    atomic_write_text(run.layout.config_toml, to_toml(run.config))


def _restore(run: RunState, journal: PrivacyJournal, ctx: DistContext, notes: list[str]) -> int:
    """Restore the newest intact checkpoint, make the journal charge at least every round any
    record proves, and bring release/ up to that checkpoint; return the next round index."""
    found = load_checkpoint(run.layout.recovery)
    if found is not None:
        notes += [f"checkpoint {d} is damaged; resuming from {found.path.name}"
                  for d in found.damaged]
        restore_adapter(run.model, found.state["adapter"])
        run.optimizer.load_state_dict(found.state["optimizer"])
        run.load_generator_states(found.state["generators"])
        run.steps_skipped = int(found.state.get("steps_skipped", 0))
    start = 0 if found is None else found.round_done  # none: start over, rounds stay charged
    if not ctx.is_main:
        return start
    journal.open()
    notes += [f"{path}: damaged line(s) {scan.damaged} charged as one round each"
              for path, scan in journal.scans.items() if scan.damaged or scan.torn_tail]
    notes += journal.notes  # one file behind the other: brought up to the larger count
    evidence = gather_evidence(run.run_dir, run.q, run.sigma, found)
    note = reconcile(journal, evidence, start,  # lost journals: the most that can have run
                     checkpoint_every=run.config.train.checkpoint_every,
                     rounds=run.config.train.rounds)
    if note is not None:
        notes.append(f"{journal.path}: {note}")
    check_charged(journal.rounds, start, str(journal.path))
    if found is not None and not release_is_current(run.run_dir, start, journal.rounds):
        _publish(run, journal, start)
        notes.append(f"release/ rewritten from {found.path.name} ({journal.rounds} rounds charged)")
    for message in notes:
        log.warning("%s", message)
    return start


def _holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds any privacy record of an earlier run."""
    layout = RunDir(run_dir)
    return (layout.has_charges() or bool(checkpoint_dirs(layout.recovery)) or layout.ledger.exists()
            or layout.release.exists())


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None: it exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_failed_start(run_dir: Path, created: Path | None, made_recovery: bool) -> None:
    """Undo a fresh start that failed before any round was charged (nothing touched data)."""
    if RunDir(run_dir).has_charges():
        return  # rounds were charged: the records must stay
    if created is None:
        if made_recovery:
            shutil.rmtree(RunDir(run_dir).recovery, ignore_errors=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:  # the parents this call created, if left empty
        if not folder.is_relative_to(created) or any(folder.iterdir()):
            break
        folder.rmdir()


__all__ = ["TrainResult", "apply_update", "grad_method", "train"]
