"""End-to-end mode of the white-box audit: gradient canaries among real per-prompt gradients.

The run is built by :func:`dpgrpo.training.setup.build_run` from the config, exactly as training
builds it (its slots, public n, q, calibrated sigma, C, sampler, noise source, policy and AdamW),
and each round follows the trainer's lines: the sampler draws the slots, the arm makes rollouts
of the sampled real records and their per-prompt gradients, and the mechanism combines them. The
K gradient canaries occupy K of the run's absent slots (``data.n_slots`` above the records), so
they are sampled by the same coins; an included, sampled canary adds the record ``s C u_i``
(its direction laid out over the named LoRA tensors) to the round's per-prompt gradients. The
update is applied with the trainer's own step, so later rollouts come from the updated policy.

The observation and its statistics are those of the model-free mode
(:mod:`dpgrpo.audit.whitebox`), with the real records in place of zero background. Nothing is
released: the run directory is scratch space for the slots ``build_run`` writes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpgrpo.audit.canary import draw_inclusion
from dpgrpo.audit.gradient_canaries import make_directions
from dpgrpo.audit.whitebox import MECHANISMS, AuditSetup, Observation
from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from dpgrpo.config import RunConfig


def _named_rows(rows: torch.Tensor, params: Mapping[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """Split (B, d) canary rows into per-tensor (B, *shape) gradients, in parameter order."""
    out, start = {}, 0
    for name, p in params.items():
        out[name] = rows[:, start:start + p.numel()].reshape(-1, *p.shape).to(p.dtype)
        start += p.numel()
    return out


def _flat(tensors: Mapping[str, torch.Tensor], names: list[str]) -> np.ndarray:
    return torch.cat([tensors[k].detach().reshape(-1).double().cpu() for k in names]).numpy()


def simulate_end_to_end(config: RunConfig, run_dir: str | Path, *, canaries: int,
                        mechanism: str = "correct", canary_scale: float = 10.0,
                        direction_seed: int = 0, seed: int | None = None
                        ) -> tuple[AuditSetup, Observation]:
    """T rounds of the real run with K gradient canaries (module docstring)."""
    from dpgrpo.privacy.accounting import RoundEvent, epsilon
    from dpgrpo.privacy.contributors import round_prompts, sum_within_records
    from dpgrpo.privacy.record_coins import PromptCoins
    from dpgrpo.training.arms import make_arm
    from dpgrpo.training.grads import per_prompt_grads, trainable_parameters
    from dpgrpo.training.quiet import quiet_model_loading
    from dpgrpo.training.setup import build_run
    from dpgrpo.training.trainer import apply_update, grad_method

    start = time.perf_counter()
    with quiet_model_loading():
        run = build_run(config, Path(run_dir))
    absent = np.array([i for i, s in enumerate(run.slots) if s is None], dtype=np.int64)
    if absent.size < canaries:
        raise ConfigError(f"{canaries} gradient canaries need as many absent slots; the run has "
                          f"{absent.size}: raise data.n_slots above the records")
    total = config.train.rounds                         # T
    setup = AuditSetup(n=run.n, q=run.q, rounds=total, sigma=run.sigma, clip_norm=run.clip_norm,
                       delta=run.delta, coordinates=run.coordinates, canaries=canaries,
                       certified_epsilon=epsilon([RoundEvent(run.q, run.sigma, total)],
                                                     run.delta),
                       canary_scale=canary_scale, learning_rate=config.train.learning_rate,
                       weight_decay=config.train.weight_decay, direction_seed=direction_seed)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    included = np.array(draw_inclusion(canaries, gen), dtype=bool)
    slot_of = {int(s): i for i, s in enumerate(absent[:canaries])}
    params = trainable_parameters(run.model)
    names = list(params)
    dirs = make_directions(run.coordinates, canaries, seed=direction_seed)
    scale = canary_scale * run.clip_norm
    before = _flat({k: p.detach().clone() for k, p in params.items()}, names)
    arm, mech = make_arm(config, run.policy, run.task), MECHANISMS[mechanism]
    units = run.expected_batch / (run.sigma * run.clip_norm)
    rounds = np.empty((total, canaries))
    for t in range(total):
        sampled = run.sampler.sample()
        mine = [int(i) for i in sampled if run.slots[i] is not None]
        records = [run.slots[i] for i in mine]
        key = run.coins.round_key(t)                    # the trainer's per-record streams
        plan = round_prompts(records, run.chooser, [key.reader(s, 0, "choose") for s in mine])
        coins = PromptCoins.for_records(key, mine, plan.bounds)
        batch, _ = arm.batch(plan.prompts, coins=coins)
        grads = sum_within_records(per_prompt_grads(
            run.model, arm.objective, batch.to(run.device), method=grad_method(config),
            rows_per_pass=config.train.pass_rows(arm.cap),
            dropout_seeds=coins.seeds("dropout")), plan)
        present = [slot_of[int(s)] for s in sampled if int(s) in slot_of]
        present = [i for i in present if included[i]]
        extra = _named_rows(dirs.gradients(present) * scale, params)
        grads = {k: torch.cat([grads[k], extra[k].to(grads[k].device)]) for k in names}
        update = mech(grads, clip_norm=run.clip_norm, noise_multiplier=run.sigma,
                      expected_batch=run.expected_batch, noise=run.noise)
        rounds[t] = dirs.project(_flat(update, names)) * units
        apply_update(run.model, run.optimizer, update, max_norm=config.train.max_update_norm)
    after = _flat(trainable_parameters(run.model), names)
    final = -dirs.project(after - before)
    return setup, Observation(included, rounds, final, time.perf_counter() - start)


__all__ = ["simulate_end_to_end"]
