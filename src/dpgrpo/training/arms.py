"""Training arms: how a sampled record becomes a TrainBatch (Algorithm 1, lines 4-6).

Every arm shares sampling, clipping, noise, the q*n denominator and the accountant; only the
per-record computation differs (Corollary 2). What each arm does is a row of the arm table
(:data:`dpgrpo.config.arms.ARMS`): its objective, where its rollouts come from (the policy, the
public base, or none for gold SFT), its advantage mode, and whether it is private. This module
reads those fields and never an arm's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from dpgrpo.config import RunConfig, TrainConfig
from dpgrpo.config.arms import ArmSpec, arm_spec
from dpgrpo.errors import PrivacyError
from dpgrpo.objectives import Objective, TrainBatch
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    compute_advantages,
    reference_logprobs,
)
from dpgrpo.objectives.sft import SFTObjective, build_filtered_sft_batch, build_gold_sft_batch
from dpgrpo.objectives.trunk import Trunk
from dpgrpo.privacy.record_coins import PromptCoins
from dpgrpo.rollout import RolloutEngine, make_engine
from dpgrpo.rollout.batch import completion_ids
from dpgrpo.tasks.base import completion_cap
from dpgrpo.training.lora_hooks import adapted_layer_index
from dpgrpo.training.metrics import Laps

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dpgrpo.model import Policy
    from dpgrpo.rollout.batch import Message, RolloutBatch
    from dpgrpo.tasks.base import Problem, Task

#: a sampled record: the task and the problem (a contributor's are several of them)
Record = tuple["Task", "Problem"]

#: objective name of the arm table -> the objective, from the train table and the public cap
OBJECTIVES: dict[str, Callable[[TrainConfig, int], Objective]] = {
    "grpo": lambda train, cap: GRPOObjective(beta=train.beta, loss_type=train.loss_type,
                                             max_completion_length=cap,
                                             temperature=train.logprob_temperature,
                                             kl_bias_correction=train.kl_bias_correction),
    "sft": lambda train, cap: SFTObjective(),
}


@dataclass
class Arm:
    """One arm's per-record computation, holding only what it uses (no run state)."""

    spec: ArmSpec
    objective: Objective
    model: torch.nn.Module      # the policy being trained (the reference pass turns LoRA off)
    tokenizer: PreTrainedTokenizerBase
    train: TrainConfig          # G, temperature, beta, pass sizes (public)
    cap: int                    # the completion cap (public)
    new_engine: Callable[[], RolloutEngine] = field(repr=False)
    laps: Laps = field(
        default_factory=Laps
    )  # public wall-clock per phase (dpgrpo.training.metrics)
    _engine: RolloutEngine | None = field(default=None, repr=False)
    _kept: Trunk | bool | None = field(default=None, repr=False)   # gold SFT's (False: none)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def engine(self) -> RolloutEngine:
        """The run's rollout engine (``train.rollout_engine``), built on first use."""
        if self._engine is None:
            self._engine = self.new_engine()
        return self._engine

    def batch(self, records: list[Record], generator: torch.Generator | None = None,
              *, coins: PromptCoins | None = None) -> tuple[TrainBatch, dict[str, float]]:
        """Build this round's TrainBatch from the sampled (task, problem) records.

        ``coins`` (the trainer's): prompt i's rollout seed and shuffle coins come from its own
        (round, slot) streams, so no batch-mate or position changes them (A2/A3). Without
        them, randomness comes from ``generator`` (tests, tools) or fresh OS entropy.
        """
        if coins is not None and len(coins) != len(records):
            raise PrivacyError(f"{len(coins)} prompts' coins for {len(records)} prompts")
        if self.spec.rollouts is None:
            return self._gold(records)
        seeds = None if coins is None else coins.seeds("rollout")
        rollouts, rewards = self._rollouts(records, generator, seeds)
        self.laps.mark("rollout")
        info = _info(rollouts, rewards)
        if self.spec.objective == "sft":  # supervised on the verified-correct completions
            return build_filtered_sft_batch(rollouts, rewards), info
        shuffle = (coins.uniforms("shuffle", self.train.group_size)
                   if coins is not None and self.spec.advantage == "shuffled" else None)
        mode = cast(str, self.spec.advantage)        # every grpo arm has one (config/arms.py)
        adv = compute_advantages(rewards, mode, generator=generator, coins=shuffle,
                                 scale=self.train.scale_rewards == "group")
        trunk = self._trunk()
        ref = (reference_logprobs(self.model, rollouts, batch_size=self.train.pass_rows(self.cap),
                                  trunk=trunk, temperature=self.train.logprob_temperature,
                                  share_prompt=self.train.share_prompt_pass)
               if self.train.beta > 0 else None)
        self.laps.mark("reference")
        return build_grpo_batch(rollouts, rewards, adv, ref, trunk=trunk,
                                mask_truncated=self.train.mask_truncated_completions,
                                share_prompt=self.train.share_prompt_pass), info

    def _kept_trunk(self) -> Trunk | None:
        """Gold SFT's trunk, kept across rounds: a record's window is the same every round, so
        its frozen layers run once per run (``train.frozen_layer_cache_mb`` of states)."""
        if self._kept is None and self.train.share_frozen_layers:
            index = adapted_layer_index(self.model)
            budget = self.train.frozen_layer_cache_mb << 20
            self._kept = Trunk(index, keep_bytes=budget) if index and budget else False
        return self._kept if isinstance(self._kept, Trunk) else None

    def _trunk(self) -> Trunk | None:
        """A fresh store for this round's frozen-layer states, when the reference pass runs
        and an adapter leaves frozen layers below it (``train.share_frozen_layers``)."""
        if self.train.beta <= 0 or not self.train.share_frozen_layers:
            return None
        index = adapted_layer_index(self.model)
        return Trunk(index) if index else None

    def _rollouts(self, records: list[Record], generator: torch.Generator | None,
                  seeds: list[int] | None) -> tuple[RolloutBatch, torch.Tensor]:
        g = self.train.group_size
        messages = [task.prompt(problem) for task, problem in records]
        rollouts = self.engine.generate(  # filtered SFT samples from the public base policy
            messages, group_size=g, temperature=self.train.temperature,
            max_new_tokens=self.cap, seeds=seeds, generator=generator,
            use_adapter=not self.spec.base_rollouts, top_p=self.train.top_p,
            repetition_penalty=self.train.repetition_penalty)
        rewards = torch.tensor([_prompt_rewards(task, problem, rollouts, i)
                                for i, (task, problem) in enumerate(records)],
                               dtype=torch.float32).reshape(len(records), g)
        return rollouts, rewards

    def _gold(self, records: list[Record]) -> tuple[TrainBatch, dict[str, float]]:
        messages: list[Message] = [task.prompt(problem) for task, problem in records]
        targets = [task.gold_target(problem) for task, problem in records]
        batch = build_gold_sft_batch(self.tokenizer, messages, targets)
        batch.trunk = self._kept_trunk()
        return batch, {"target_tokens_mean": float(batch.loss_mask.sum(1).float().mean())
                       if records else 0.0}


def _prompt_rewards(task: Task, problem: Problem, rollouts: RolloutBatch, i: int) -> list[float]:
    """Prompt ``i``'s G rewards from its own completions only: a task with ``group_rewards``
    (one prompt's group in one call: TRL-style reward functions) or one ``reward`` call each."""
    texts = rollouts.texts[i]
    group = getattr(task, "group_rewards", None)
    if group is None:
        return [task.reward(text, problem) for text in texts]
    return cast(list[float], group(texts, problem, completion_ids(rollouts, i)))


def _info(rollouts: RolloutBatch, rewards: torch.Tensor) -> dict[str, float]:
    """Per-round telemetry (private: recovery/ only)."""
    if rewards.numel() == 0:
        return {"reward_mean": float("nan"), "length_mean": 0.0, "cap_rate": 0.0,
                "constant_reward_groups": 0}
    constant = int((rewards.max(dim=1).values == rewards.min(dim=1).values).sum())
    return {"reward_mean": float(rewards.mean()),
            "length_mean": float(rollouts.completion_lengths.float().mean()),
            "cap_rate": float(rollouts.hit_cap.float().mean()),
            "constant_reward_groups": constant}


def make_arm(config: RunConfig, policy: Policy, task: Task) -> Arm:
    """The arm named by ``train.arm``, over ``policy`` (model and tokenizer) and ``task`` (its
    default completion cap when ``train.max_new_tokens`` is not set)."""
    spec, train = arm_spec(config.train.arm), config.train
    cap = completion_cap(task, train.max_new_tokens)

    def new_engine() -> RolloutEngine:
        return make_engine(train.rollout_engine, policy.model, policy.tokenizer,
                           isolated=train.rollout_isolation == "isolated",
                           rows_per_call=train.rollout_rows(cap), model_name=config.model.name,
                           dtype=config.model.dtype, **train.engine_options())

    return Arm(spec, OBJECTIVES[spec.objective](train, cap), policy.model, policy.tokenizer,
               train, cap, new_engine)


__all__ = ["OBJECTIVES", "Arm", "make_arm"]
