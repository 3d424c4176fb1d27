"""Training arms: how a sampled record becomes a TrainBatch (Algorithm 1, lines 4-6).

Every arm shares sampling, clipping, noise, the q*n denominator and the accountant; only the
per-record computation differs (Corollary 2):

* ``dp-grpo``: G completions from the policy, verifier rewards, Eq. (2) advantages, Eq. (7).
* ``zero-advantage``: the same, with every advantage set to 0 after verification (Section V).
* ``shuffled-reward`` / ``positive-only``: the advantage ladder of Section IX.
* ``non-private``: dp-grpo with sigma = 0 (clipping on or off).
* ``filtered-sft`` / ``gold-sft``: the private supervised comparators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dpgrpo.metrics import Laps
from dpgrpo.objectives import TrainBatch
from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, compute_advantages
from dpgrpo.objectives.grpo import reference_logprobs
from dpgrpo.objectives.sft import SFTObjective, build_filtered_sft_batch, build_gold_sft_batch
from dpgrpo.rollout import RolloutEngine, make_engine

ADVANTAGE_MODE = {"dp-grpo": "group", "non-private": "group", "zero-advantage": "zero",
                  "shuffled-reward": "shuffled", "positive-only": "positive"}


@dataclass
class Arm:
    name: str
    objective: Any
    run: Any
    laps: Laps = field(default_factory=Laps)  # public wall-clock per phase (dpgrpo.metrics)
    _engine: RolloutEngine | None = field(default=None, repr=False)

    @property
    def engine(self) -> RolloutEngine:
        """The run's rollout engine (``train.rollout_engine``), built on first use."""
        if self._engine is None:
            cfg = self.run.config
            self._engine = make_engine(
                cfg.train.rollout_engine, self.run.model, self.run.policy.tokenizer,
                isolated=cfg.train.rollout_isolation == "isolated",
                rows_per_call=cfg.train.rollout_rows(self.cap), model_name=cfg.model.name,
                dtype=cfg.model.dtype, **cfg.train.engine_options())
        return self._engine

    @property
    def cap(self) -> int:
        """The completion cap (public): ``train.max_new_tokens`` or the task's default."""
        return self.run.config.train.max_new_tokens or self.run.task.default_max_new_tokens

    def batch(self, records: list[tuple[Any, Any]], generator: torch.Generator
              ) -> tuple[TrainBatch, dict[str, float]]:
        """Build this round's TrainBatch from the sampled (task, problem) records."""
        if self.name == "gold-sft":
            return self._gold(records)
        rollouts, rewards = self._rollouts(records, generator, base=self.name == "filtered-sft")
        self.laps.mark("rollout")
        info = _info(rollouts, rewards)
        if self.name == "filtered-sft":
            return build_filtered_sft_batch(rollouts, rewards), info
        cfg = self.run.config.train
        adv = compute_advantages(rewards, ADVANTAGE_MODE[self.name], generator=generator)
        ref = (reference_logprobs(self.run.model, rollouts,
                                  batch_size=cfg.rows_per_pass(self.cap))
               if cfg.beta > 0 else None)
        self.laps.mark("reference")
        return build_grpo_batch(rollouts, rewards, adv, ref), info

    def _rollouts(self, records: list[tuple[Any, Any]], generator: torch.Generator, *,
                  base: bool) -> tuple[Any, torch.Tensor]:
        cfg, cap = self.run.config.train, self.cap
        messages = [task.prompt(problem) for task, problem in records]
        rollouts = self.engine.generate(  # filtered SFT samples from the public base policy
            messages, group_size=cfg.group_size, temperature=cfg.temperature,
            max_new_tokens=cap, generator=generator, use_adapter=not base)
        rewards = torch.tensor([[task.reward(text, problem) for text in texts]
                                for (task, problem), texts in zip(records, rollouts.texts)],
                               dtype=torch.float32).reshape(len(records), cfg.group_size)
        return rollouts, rewards

    def _gold(self, records: list[tuple[Any, Any]]) -> tuple[TrainBatch, dict[str, float]]:
        messages = [task.prompt(problem) for task, problem in records]
        targets = [task.gold_target(problem) for task, problem in records]
        batch = build_gold_sft_batch(self.run.policy.tokenizer, messages, targets)
        return batch, {"target_tokens_mean": float(batch.loss_mask.sum(1).float().mean())
                       if records else 0.0}


def _info(rollouts: Any, rewards: torch.Tensor) -> dict[str, float]:
    """Per-round telemetry (private: recovery/ only)."""
    if rewards.numel() == 0:
        return {"reward_mean": float("nan"), "length_mean": 0.0, "cap_rate": 0.0,
                "constant_reward_groups": 0}
    constant = int((rewards.max(dim=1).values == rewards.min(dim=1).values).sum())
    return {"reward_mean": float(rewards.mean()),
            "length_mean": float(rollouts.completion_lengths.float().mean()),
            "cap_rate": float(rollouts.hit_cap.float().mean()),
            "constant_reward_groups": constant}


def make_arm(run: Any) -> Arm:
    """The arm named by ``run.config.train.arm``."""
    name = run.config.train.arm
    if name in ("filtered-sft", "gold-sft"):
        return Arm(name, SFTObjective(), run)
    return Arm(name, GRPOObjective(beta=run.config.train.beta), run)


__all__ = ["ADVANTAGE_MODE", "Arm", "make_arm"]
