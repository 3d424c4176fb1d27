"""Everything a run needs before its first round: slots, sigma, generators, model, optimizer.

Public inputs only (assumption A1): n, q, sigma, C and T are fixed here from the configuration
(:func:`dpgrpo.privacy.sampling.public_slot_count` says which rule fixed n), never from the
content of the prompts nor from how many of them are valid.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from dpgrpo.config import RunConfig
from dpgrpo.errors import ConfigError
from dpgrpo.privacy.budget import PublicConstants, public_constants
from dpgrpo.privacy.contributors import (
    CONTRIBUTOR,
    ProblemChooser,
    as_contributors,
)
from dpgrpo.privacy.noise import NoiseSource, check_noise_tail, noise_tail_delta
from dpgrpo.privacy.record_coins import RecordRandomness
from dpgrpo.privacy.sampling import SAMPLERS, PoissonSampler, SlotCount
from dpgrpo.privacy.seeds import derive_seed
from dpgrpo.rundir.layout import RunDir
from dpgrpo.tasks.splits import public_slots
from dpgrpo.training.canaries import CanaryPlan
from dpgrpo.training.distributed import DistContext, barrier, broadcast_object, device_for
from dpgrpo.training.grads import trainable_parameters

if TYPE_CHECKING:
    from dpgrpo.model import Policy
    from dpgrpo.tasks.base import Task

log = logging.getLogger(__name__)
#: the slow phases before round 1, one INFO line each (public values only: the task's and the
#: model's configured names); the CLI prints them (``cli/_progress.phase_lines``)
phases = logging.getLogger("dpgrpo.progress")

@dataclass
class RunState:
    """The mutable state of one run (model, optimizer, generators) and its public constants."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    slots: list[Any]              # n entries: (task, problem), a Contributor, or None (absent)
    public: PublicConstants       # n, m, q, delta, sigma, C (privacy.budget: their one resolver)
    sampler: PoissonSampler
    noise: NoiseSource
    policy: Policy
    optimizer: torch.optim.Optimizer
    task: Task
    num_canaries: int = 0
    n_source: str = "data.n_slots"
    coordinates: int = 0          # d: trainable coordinates, each noised every round (public)
    steps_skipped: int = 0
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    coins: RecordRandomness = field(default_factory=RecordRandomness)  # per-record streams
    chooser: ProblemChooser | None = None  # contributor-level DP: which k problems (hidden)
    init_adapter_sha256: str | None = None  # model.init_adapter's weights, read at start-up

    @property
    def model(self) -> torch.nn.Module:
        return cast(torch.nn.Module, self.policy.model)

    @functools.cached_property
    def layout(self) -> RunDir:
        """The run directory's paths (:class:`~dpgrpo.rundir.layout.RunDir`)."""
        return RunDir(self.run_dir)

    @property
    def n(self) -> int:
        return self.public.n

    @property
    def q(self) -> float:
        return self.public.q

    @property
    def delta(self) -> float:
        return self.public.delta

    @property
    def sigma(self) -> float:
        return self.public.sigma

    @property
    def clip_norm(self) -> float:
        return self.public.clip_norm

    @property
    def expected_batch(self) -> float:
        """The public q * n (line 8's denominator)."""
        return self.q * self.n

    @property
    def seeded(self) -> bool:
        return self.config.privacy.seed is not None

    def generator_states(self) -> dict[str, object]:
        """Every generator a resumed run needs (the record streams need none: see record_coins)."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return {"sampler": self.sampler.state_dict(), "noise": self.noise.state_dict(),
                "rollout": self.coins.state_dict(),
                "torch": torch.get_rng_state(), "cuda": cuda,
                "chooser": None if self.chooser is None else self.chooser.state_dict()}

    def load_generator_states(self, states: dict[str, Any]) -> None:
        self.sampler.load_state_dict(states["sampler"])
        self.noise.load_state_dict(states["noise"])
        self.coins.load_state_dict(states.get("rollout"))
        if self.chooser is not None and states.get("chooser") is not None:
            self.chooser.load_state_dict(states["chooser"])
        if self.seeded:  # unseeded runs keep the fresh OS-entropy seed drawn at start-up
            torch.set_rng_state(states["torch"])
            if states.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])


def resolve_device(name: str) -> torch.device:
    """``model.device`` as a torch device that this machine has ("auto": CUDA if present).

    A string torch cannot parse, or a device the machine lacks, is a ConfigError naming
    model.device, before any folder or round (torch would fail later, mid-load, with a
    traceback).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"model.device = {name!r} is not a device (use auto, cpu, cuda, "
                          "cuda:N or mps)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"model.device = {name!r}, but this machine has no CUDA device "
                              "(use auto or cpu)")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"model.device = {name!r}, but this machine has {count} CUDA "
                              f"device(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"model.device = {name!r}, but MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"model.device = {name!r}: dpgrpo runs on cpu, cuda or mps")
    return device


def _slots(config: RunConfig, task: object, run_dir: Path,
           ctx: DistContext) -> tuple[list[Any], SlotCount]:
    """n public slots (:func:`~dpgrpo.tasks.splits.public_slots`): the split's first valid
    problems, absent slots, then the canaries."""
    found = public_slots(config, task)
    # found.skipped, the count of invalid records, is private: it reaches no log at any level
    # (invariant 6); the curator lists them with `dpgrpo data summary --skip-invalid`.
    k, count = config.audit.canaries, found.count
    canaries = _canary_slots(config, run_dir, ctx, first_slot=count.n - k) if k else []
    if found.contributors is not None:  # the record is a contributor (privacy/contributors.py)
        return found.contributors + as_contributors(canaries), count
    slots: list[Any] = [(task, p) for p in found.problems]
    slots += [None] * (count.n - k - len(slots))  # absent records: they contribute zero
    return slots + canaries, count


def _canary_slots(config: RunConfig, run_dir: Path, ctx: DistContext, first_slot: int) -> list[Any]:
    """The k canary slots (the last k of n, public); an absent canary's slot is an empty record."""
    from dpgrpo.tasks import get_task

    k = config.audit.canaries
    plan_path = RunDir(run_dir).canaries
    if ctx.active and not ctx.is_main:  # rank 0 draws the secret bits; the others read them
        barrier(ctx)
        plan = CanaryPlan.load(plan_path)
    elif plan_path.exists():  # resume: the same canaries and the same secret inclusion bits
        plan = CanaryPlan.load(plan_path)
    else:
        gen = None
        if config.privacy.seed is not None:
            seed = cast(int, derive_seed(config.privacy.seed, "canaries"))  # seed is set
            gen = torch.Generator().manual_seed(seed)
        plan = CanaryPlan.create(k, seed=config.audit.canary_seed, generator=gen)
        plan = replace(plan, slots=tuple(range(first_slot, first_slot + k)))  # public
        plan.save(plan_path)
    if ctx.active and ctx.is_main:
        barrier(ctx)
    arithmetic = get_task("arithmetic")
    present = {c.id for c in plan.present}
    return [(arithmetic, c) if c.id in present else None for c in plan.canaries]


def _epsilon_ceiling(q: float, sigma: float, rounds: int, delta: float) -> float:
    """An upper bound on the run's epsilon, to gate the noise-tail term before any round: the
    PLD accountant on a coarse pessimistic grid (1e-2, an upper bound, fast), and the closed
    form of T unsampled Gaussian rounds (zCDP, rho = T / (2 sigma^2)) if that is smaller."""
    from dpgrpo.privacy.accounting import RoundEvent, epsilon

    rho = rounds / (2.0 * sigma ** 2)
    closed = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    coarse = epsilon([RoundEvent(q, sigma, rounds)], delta, value_discretization_interval=1e-2)
    return min(closed, coarse)


def build_run(config: RunConfig, run_dir: Path, ctx: DistContext | None = None) -> RunState:
    """Resolve the public constants, calibrate sigma, load the model and the optimizer."""
    from dpgrpo.model import enable_gradient_checkpointing, load_policy, public_model_name
    from dpgrpo.model_adapters import LoraSettings, adapter_digest
    from dpgrpo.tasks import get_task

    ctx = ctx or DistContext()
    run_dir.mkdir(parents=True, exist_ok=True)
    task = get_task(config.data.task)
    phases.info("reading the data (task %s)", config.data.task)
    slots, count = _slots(config, task, run_dir, ctx)
    if config.private and config.privacy.noise_multiplier is None:
        phases.info("calibrating sigma to epsilon %g", config.privacy.epsilon)
    public = public_constants(config, count.n, refuse_weak_delta=True)
    n, q, delta, sigma = public.n, public.q, public.delta, public.sigma
    p, rounds = config.privacy, public.rounds
    device = device_for(ctx, resolve_device(config.model.device))
    if config.train.rollout_engine == "vllm":  # refuse before any round, not at the first one
        from dpgrpo.rollout.vllm_engine import require_vllm

        require_vllm(str(device))
    seed = p.seed
    # torch's global generator drives LoRA's A initialization (dropout masks are reseeded per
    # prompt from its (round, slot) stream inside a fork, grads.PromptDropout). Its built-in
    # default seed is a public constant, so unseeded runs reseed it from OS entropy; all
    # ranks start from rank 0's draw so that they hold the same adapter.
    init_seed = broadcast_object(
        seed if seed is not None else int.from_bytes(os.urandom(8), "little"), ctx
    )
    torch.manual_seed(init_seed)
    m = config.model
    lora = LoraSettings.from_config(m)
    phases.info("loading the model %s", m.name)
    policy = load_policy(m.name, lora=lora, dtype=m.dtype, device=device)
    init_sha = adapter_digest(m.init_adapter) if m.init_adapter is not None else None
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(policy.model)
    for peft_config in getattr(policy.model, "peft_config", {}).values():
        peft_config.base_model_name_or_path = public_model_name(m.name)  # hub id, not a cache path
    policy.model.train()
    params = list(trainable_parameters(policy.model).values())
    coordinates = sum(prm.numel() for prm in params)
    if config.private:  # refuse before any round if the generator's tails would matter
        eps_gate = (
            p.epsilon if p.noise_multiplier is None else _epsilon_ceiling(q, sigma, rounds, delta)
        )
        check_noise_tail(noise_tail_delta(coordinates, rounds, eps_gate), delta)
    optimizer = torch.optim.AdamW(params, lr=config.train.learning_rate,
                                  weight_decay=config.train.weight_decay)
    chooser = None
    if config.data.privacy_unit == CONTRIBUTOR:
        chooser = ProblemChooser(config.data.per_contributor,
                                 seed=derive_seed(seed, "chooser", ctx.rank))
    return RunState(config=config, run_dir=run_dir, device=device, slots=slots, public=public,
                    sampler=SAMPLERS[config.train.batch_sampling](n, q, seed=seed),
                    noise=NoiseSource(seed=derive_seed(seed, "noise")),
                    policy=policy, optimizer=optimizer, task=task,
                    num_canaries=config.audit.canaries, n_source=count.source,
                    coordinates=coordinates, coins=RecordRandomness(seed=seed), chooser=chooser,
                    init_adapter_sha256=init_sha)


__all__ = ["RunState", "build_run", "resolve_device"]
