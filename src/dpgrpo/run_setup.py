"""Everything a run needs before its first round: slots, sigma, generators, model, optimizer.

Public inputs only (assumption A1): n, q, sigma, C and T are fixed here from the configuration
(:func:`dpgrpo.privacy.sampling.public_slot_count` says which rule fixed n), never from the
content of the prompts nor from how many of them are valid.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dpgrpo import __version__
from dpgrpo.arm_table import ARMS, arm_spec
from dpgrpo.config import ModelConfig, RunConfig
from dpgrpo.errors import ConfigError
from dpgrpo.grads import trainable_parameters
from dpgrpo.distributed import DistContext, barrier, broadcast_object, device_for
from dpgrpo.privacy.accounting import (
    ACCOUNTANT,
    NEIGHBOURING_RELATION,
    PrivacyLedger,
    accountant_version,
)
from dpgrpo.privacy.budget import public_constants, public_slots
from dpgrpo.privacy.contributors import CONTRIBUTOR, ProblemChooser, as_contributors
from dpgrpo.privacy.contributors import unit_description
from dpgrpo.privacy.figures import neighbour_figures
from dpgrpo.privacy.noise import GENERATOR, NoiseSource, check_noise_tail, noise_tail_delta
from dpgrpo.privacy.record_coins import GENERATOR as RECORD_GENERATOR
from dpgrpo.privacy.record_coins import RecordRandomness
from dpgrpo.privacy.sampling import N_SOURCES, PoissonSampler, SlotCount
from dpgrpo.rundir import RunDir

log = logging.getLogger(__name__)

ASSUMPTIONS = {
    "A1": "public design: every hyperparameter, n and T fixed without access to the data",
    "A2": "record isolation: each prompt's clipped gradient depends on that prompt alone; "
          "batched floating-point inference kernels and the verifier's wall-clock limit can "
          "couple records outside exact arithmetic (not quantified)",
    "A3": "fresh hidden randomness: sampling coins, rollouts and noise from OS entropy, never "
          "released (recovery/ holds generator states and must not be published); each "
          "record's rollout coins, dropout masks and shuffles are bound to its round and slot "
          "(ChaCha20 under a fresh 256-bit round key, the slot as nonce), so they do not depend "
          "on its batch-mates",
    "A4": "exact arithmetic: noise is drawn in binary floating point, not over the reals "
          "(its truncated tails are bounded and added to delta as noise_tail_delta; the "
          "discreteness of each fp64 draw is not quantified)",
}

CRASHES = (
    "rounds_charged counts every round that started, including rounds replayed after a crash or "
    "an interruption, and epsilon is computed from it: charged rounds are never hidden. The "
    "number of replayed rounds (rounds_replayed) is itself an output of the execution and is "
    "covered by this guarantee only insofar as crashes are independent of the private data; a "
    "data-triggered crash (e.g. out of memory on one long rollout) can reveal something about "
    "the records sampled in that round. Use settings that cannot run out of memory at the "
    "worst case (train.max_new_tokens, train.rollout_batch_size, train.chunk_size sized for G "
    "completions of the longest prompt at the token cap).")


@dataclass
class RunState:
    """The mutable state of one run (model, optimizer, generators) and its public constants."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    slots: list[Any]              # n entries: (task, problem), a Contributor, or None (absent)
    n: int
    q: float
    delta: float
    sigma: float
    clip_norm: float
    sampler: PoissonSampler
    noise: NoiseSource
    policy: Any
    optimizer: torch.optim.Optimizer
    task: Any
    num_canaries: int = 0
    n_source: str = "data.n_slots"
    coordinates: int = 0          # d: trainable coordinates, each noised every round (public)
    steps_skipped: int = 0
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    coins: RecordRandomness = field(default_factory=RecordRandomness)  # per-record streams
    chooser: ProblemChooser | None = None  # contributor-level DP: which k problems (hidden)
    init_adapter_sha256: str | None = None  # model.init_adapter's weights, read at start-up

    @property
    def model(self) -> Any:
        return self.policy.model

    @property
    def expected_batch(self) -> float:
        """The public q * n (line 8's denominator)."""
        return self.q * self.n

    @property
    def seeded(self) -> bool:
        return self.config.privacy.seed is not None

    def generator_states(self) -> dict[str, Any]:
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


def _slots(config: RunConfig, task: Any, run_dir: Path,
           ctx: DistContext) -> tuple[list[Any], SlotCount]:
    """n public slots (:func:`~dpgrpo.privacy.budget.public_slots`): the split's first valid
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
    from dpgrpo.audit.canary import CanaryPlan
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
            gen = torch.Generator().manual_seed(config.privacy.seed + 3)
        plan = CanaryPlan.create(k, seed=config.audit.canary_seed, generator=gen)
        plan = replace(plan, slots=tuple(range(first_slot, first_slot + k)))  # public
        plan.save(plan_path)
    if ctx.active and ctx.is_main:
        barrier(ctx)
    arithmetic = get_task("arithmetic")
    present = {c.id for c in plan.present}
    return [(arithmetic, c) if c.id in present else None for c in plan.canaries]


def _epsilon_ceiling(q: float, sigma: float, steps: int, delta: float) -> float:
    """An upper bound on the run's epsilon, to gate the noise-tail term before any round: the
    PLD accountant on a coarse pessimistic grid (1e-2, an upper bound, fast), and the closed
    form of T unsampled Gaussian rounds (zCDP, rho = T / (2 sigma^2)) if that is smaller."""
    from dpgrpo.privacy.accounting import RoundEvent, pld_epsilon

    rho = steps / (2.0 * sigma ** 2)
    closed = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    coarse = pld_epsilon([RoundEvent(q, sigma, steps)], delta, value_discretization_interval=1e-2)
    return min(closed, coarse)


def build_run(config: RunConfig, run_dir: Path, ctx: DistContext | None = None) -> RunState:
    """Resolve the public constants, calibrate sigma, load the model and the optimizer."""
    from dpgrpo.model import LoraSettings, adapter_digest, enable_gradient_checkpointing
    from dpgrpo.model import load_policy
    from dpgrpo.model import public_model_name
    from dpgrpo.tasks import get_task

    ctx = ctx or DistContext()
    run_dir.mkdir(parents=True, exist_ok=True)
    task = get_task(config.data.task)
    slots, count = _slots(config, task, run_dir, ctx)
    public = public_constants(config, count.n, refuse_weak_delta=True)
    n, q, delta, sigma, clip = public.n, public.q, public.delta, public.sigma, public.clip_norm
    p, steps = config.privacy, public.steps
    device = device_for(ctx, resolve_device(config.model.device))
    if config.train.rollout_engine == "vllm":  # refuse before any round, not at the first one
        from dpgrpo.rollout.vllm_engine import require_vllm

        require_vllm(str(device))
    seed = p.seed
    # torch's global generator drives LoRA's A initialization (dropout masks are reseeded per
    # prompt from its (round, slot) stream inside a fork, grads.PromptDropout). Its built-in
    # default seed is a public constant, so unseeded runs reseed it from OS entropy; all
    # ranks start from rank 0's draw so that they hold the same adapter.
    init_seed = broadcast_object(seed if seed is not None else int.from_bytes(os.urandom(8), "little"), ctx)
    torch.manual_seed(init_seed)
    m = config.model
    lora = LoraSettings.from_config(m)
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
        eps_gate = p.epsilon if p.noise_multiplier is None else _epsilon_ceiling(q, sigma, steps, delta)
        check_noise_tail(noise_tail_delta(coordinates, steps, eps_gate), delta)
    optimizer = torch.optim.AdamW(params, lr=config.train.learning_rate,
                                  weight_decay=config.train.weight_decay)
    chooser = None
    if config.data.privacy_unit == CONTRIBUTOR:
        chooser = ProblemChooser(config.data.per_contributor,
                                 seed=None if seed is None else seed + 4 + 7919 * ctx.rank)
    return RunState(config=config, run_dir=run_dir, device=device, slots=slots, n=n, q=q,
                    delta=delta, sigma=sigma, clip_norm=clip,
                    sampler=PoissonSampler(n, q, seed=seed),
                    noise=NoiseSource(seed=None if seed is None else seed + 1),
                    policy=policy, optimizer=optimizer, task=task,
                    num_canaries=config.audit.canaries, n_source=count.source,
                    coordinates=coordinates, coins=RecordRandomness(seed=seed), chooser=chooser,
                    init_adapter_sha256=init_sha)


def record_isolation(rollout_mode: str, engine: str = "transformers",
                     privacy_unit: str = "prompt") -> dict[str, str]:
    """What the run did about assumption A2's execution gaps (stated in the certificate)."""
    from dpgrpo.rollout.factory import isolation_statement

    gradients = ("exact: every pass holds rows of one prompt on that prompt's own columns, "
                 "so its gradient and reference log-probs are bit-identical whatever its "
                 "batch-mates (dpgrpo verify: batchmate_isolation)")
    if privacy_unit == CONTRIBUTOR:
        gradients += ("; a contributor's gradient is the sum of its own prompts' gradients, "
                      "clipped once")
    return {
        "gradients": gradients,
        "rollouts": isolation_statement(engine, rollout_mode),
        "rollout_mode": rollout_mode,
        "rollout_engine": engine,
        "verifier": "the verifier's wall-clock limit can couple a reward to machine load",
    }


def adapter_statement(model: ModelConfig, coordinates: int,
                      init_sha256: str | None = None) -> dict[str, Any]:
    """What the adapter trains, what stays frozen and where it started (the certificate's
    ``adapter``): every coordinate of ``trainable_coordinates`` is noised every round."""
    from dpgrpo.config import LORA_TRAIN

    init = None if model.init_adapter is None else {
        "path": model.init_adapter, "sha256": init_sha256, "keep": model.init_adapter_keep,
        "public_input": "a warm start is public input (assumption A1): it must have been "
                        "trained without this run's private data; the guarantee covers what "
                        "this run adds to it"}
    return {"lora_train": model.lora_train, "trains": LORA_TRAIN[model.lora_train],
            "trainable_coordinates": coordinates, "lora_rank": model.lora_rank,
            "lora_bias": model.lora_bias, "target_modules": list(model.target_modules),
            "lora_layers": None if model.lora_layers is None else list(model.lora_layers),
            "init_adapter": init}


def certificate(run: RunState, ledger: PrivacyLedger, round_done: int) -> dict[str, Any]:
    """The privacy certificate written to release/certificate.json."""
    cfg = run.config
    arm = arm_spec(cfg.train.arm)
    eps = ledger.epsilon(run.delta) if cfg.private else math.inf
    rdp, order = ledger.rdp_epsilon(run.delta) if cfg.private else (math.inf, math.nan)
    releasable = (cfg.private and not run.seeded and run.noise.releasable
                  and run.sampler.releasable and run.coins.releasable)
    tail = noise_tail_delta(run.coordinates, ledger.rounds, eps) if cfg.private else 0.0
    cert: dict[str, Any] = {
        "epsilon": eps, "delta": run.delta + tail, "delta_pld": run.delta,
        "noise_tail_delta": tail, "private": cfg.private, "arm": cfg.train.arm,
        "q": run.q, "sigma": run.sigma, "clip_norm": run.clip_norm, "n": run.n,
        "n_source": N_SOURCES[run.n_source],
        "expected_batch": run.expected_batch, "steps": cfg.train.steps,
        "rounds_retained": round_done, "rounds_charged": ledger.rounds,
        "rounds_replayed": ledger.rounds - round_done, "crashes": CRASHES,
        "neighbouring_relation": NEIGHBOURING_RELATION,
        "unit": unit_description(cfg.data.privacy_unit, cfg.data.per_contributor),
        "accountant": ACCOUNTANT, "accountant_version": accountant_version(),
        "rdp_epsilon": rdp, "rdp_order": order, "ledger": ledger.to_dict(),
        "seeded": run.seeded, "releasable": releasable, "noise": "secure" if run.noise.secure else "seeded",
        "noise_generator": GENERATOR, "record_randomness": RECORD_GENERATOR,
        "trainable_coordinates": run.coordinates,
        "adapter": adapter_statement(cfg.model, run.coordinates, run.init_adapter_sha256),
        "model": cfg.model.name, "task": cfg.data.task, "group_size": cfg.train.group_size,
        "canary_slots": run.num_canaries, "dpgrpo_version": __version__, "assumptions": ASSUMPTIONS,
        "record_isolation": record_isolation(cfg.train.rollout_isolation,
                                             cfg.train.rollout_engine, cfg.data.privacy_unit),
        "budget_independent_of": ["group size G", "clipping norm C", "loss", "verifier"],
        "shared_budget": (f"every private arm ({', '.join(a for a in ARMS if ARMS[a].private)}) "
                          f"run with n = {run.n}, q = {run.q:.6g}, sigma = {run.sigma:.10g}, "
                          f"T = {cfg.train.steps} and delta = {run.delta:.6g} has exactly this "
                          "epsilon: only the per-record gradient differs (Corollary 2); this "
                          f"run's arm, {arm.name}: {arm.description}"),
    }
    if cfg.private and math.isfinite(eps):
        # replace-one and a person's k prompts, accounted at the same delta_pld, each delta
        # with the noise-tail term at its own epsilon like the headline (privacy/figures.py)
        cert.update(neighbour_figures(
            ledger.events, run.delta, cfg.privacy.group_sizes,
            tail=lambda e: noise_tail_delta(run.coordinates, ledger.rounds, e)))
        if cfg.privacy.noise_multiplier is None:
            cert["target_epsilon"] = cfg.privacy.epsilon
    if not releasable:
        cert["not_releasable_because"] = (
            f"{arm.name} arm: {arm.description}" if not cfg.private else
            "seeded generators (privacy.seed): sampling coins and noise are reproducible")
    return cert


__all__ = ["RunState", "build_run", "certificate", "record_isolation", "resolve_device"]
