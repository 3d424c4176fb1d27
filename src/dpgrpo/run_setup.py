"""Everything a run needs before its first round: slots, sigma, generators, model, optimizer.

Public inputs only (assumption A1): n, q, sigma, C and T are fixed here from the configuration
and the *number* of slots, never from the content of the prompts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dpgrpo import __version__
from dpgrpo.config import RunConfig
from dpgrpo.distributed import DistContext, barrier, broadcast_object, device_for
from dpgrpo.errors import ConfigError, PrivacyBudgetError
from dpgrpo.privacy.accounting import (
    ACCOUNTANT,
    NEIGHBOURING_RELATION,
    PrivacyLedger,
    accountant_version,
    calibrate,
    compute_epsilon,
    default_delta,
    sampling_rate,
)
from dpgrpo.privacy.figures import neighbour_figures
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.privacy.sampling import PoissonSampler

ASSUMPTIONS = {
    "A1": "public design: every hyperparameter, n and T fixed without access to the data",
    "A2": "record isolation: each prompt's clipped gradient depends on that prompt alone; "
          "batched floating-point inference kernels and the verifier's wall-clock limit can "
          "couple records outside exact arithmetic (not quantified)",
    "A3": "fresh hidden randomness: sampling coins, rollouts and noise from OS entropy, never "
          "released (recovery/ holds generator states and must not be published)",
    "A4": "exact arithmetic: noise is drawn in binary floating point, not over the reals",
}


@dataclass
class RunState:
    """The mutable state of one run (model, optimizer, generators) and its public constants."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    slots: list[Any]              # n entries: (task, problem) or None for an absent slot
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
    steps_skipped: int = 0
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    _rollout_gen: torch.Generator | None = None

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

    def rollout_generator(self) -> torch.Generator:
        """Rollout randomness: fresh OS entropy every round, or the debugging seed's stream."""
        if self._rollout_gen is not None:
            return self._rollout_gen
        return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))

    def generator_states(self) -> dict[str, Any]:
        """Every generator a resumed run needs (LoRA dropout uses torch's global generator)."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return {"sampler": self.sampler.state_dict(), "noise": self.noise.state_dict(),
                "rollout": None if self._rollout_gen is None else self._rollout_gen.get_state(),
                "torch": torch.get_rng_state(), "cuda": cuda}

    def load_generator_states(self, states: dict[str, Any]) -> None:
        self.sampler.load_state_dict(states["sampler"])
        self.noise.load_state_dict(states["noise"])
        if self._rollout_gen is not None and states.get("rollout") is not None:
            self._rollout_gen.set_state(states["rollout"])
        if self.seeded:  # unseeded runs keep the fresh OS-entropy seed drawn at start-up
            torch.set_rng_state(states["torch"])
            if states.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _slots(config: RunConfig, task: Any, run_dir: Path, ctx: DistContext) -> tuple[list[Any], int]:
    from dpgrpo.tasks import get_task, load_problems

    data = config.data
    problems = load_problems(task, data.split, data.data_dir, source=data.source,
                             skip_invalid=data.skip_invalid)
    if data.limit is not None:
        problems = problems[:data.limit]
    slots: list[Any] = [(task, p) for p in problems]
    k = config.audit.canaries
    if k:
        from dpgrpo.audit.canary import CanaryPlan

        plan_path = run_dir / "recovery" / "canaries.json"
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
            plan = replace(plan, slots=tuple(range(len(slots), len(slots) + k)))  # public
            plan.save(plan_path)
        if ctx.active and ctx.is_main:
            barrier(ctx)
        arithmetic = get_task("arithmetic")
        present = {c.id for c in plan.present}  # an absent canary's slot is an empty record
        slots += [(arithmetic, c) if c.id in present else None for c in plan.canaries]
    n = data.n_slots or len(slots)
    if n < len(slots):
        raise ConfigError(f"data.n_slots = {n} is smaller than the {len(slots)} records "
                          f"(problems + canaries)")
    return slots + [None] * (n - len(slots)), n


def build_run(config: RunConfig, run_dir: Path, ctx: DistContext | None = None) -> RunState:
    """Resolve the public constants, calibrate sigma, load the model and the optimizer."""
    from dpgrpo.model import LoraSettings, load_policy
    from dpgrpo.tasks import get_task

    ctx = ctx or DistContext()
    run_dir.mkdir(parents=True, exist_ok=True)
    task = get_task(config.data.task)
    slots, n = _slots(config, task, run_dir, ctx)
    p = config.privacy
    if p.expected_batch > n:
        raise ConfigError(f"privacy.expected_batch = {p.expected_batch} exceeds n = {n} slots")
    q = sampling_rate(n, p.expected_batch)
    delta = p.delta if p.delta is not None else default_delta(n)
    steps = config.train.steps
    if not config.private:
        sigma = 0.0
        clip = p.clip_norm if config.train.clip_nonprivate else math.inf
    elif p.noise_multiplier is not None:
        sigma, clip = p.noise_multiplier, p.clip_norm
    else:
        try:
            sigma = calibrate(n, p.expected_batch, steps, p.epsilon, delta).sigma
        except PrivacyBudgetError as err:
            raise ConfigError(f"privacy.epsilon = {p.epsilon} is unreachable with n = {n}, "
                              f"m = {p.expected_batch}, T = {steps}: {err}") from None
        clip = p.clip_norm
    device = device_for(ctx, resolve_device(config.model.device))
    seed = p.seed
    # torch's global generator drives LoRA's A initialization and dropout masks. Its built-in
    # default seed is a public constant, so unseeded runs reseed it from OS entropy (A3); all
    # ranks start from rank 0's draw so that they hold the same adapter.
    init_seed = broadcast_object(seed if seed is not None else int.from_bytes(os.urandom(8), "little"), ctx)
    torch.manual_seed(init_seed)
    m = config.model
    lora = LoraSettings(rank=m.lora_rank, alpha=m.lora_alpha, dropout=m.lora_dropout,
                        target_modules=tuple(m.target_modules))
    policy = load_policy(m.name, lora=lora, dtype=m.dtype, device=device)
    for peft_config in getattr(policy.model, "peft_config", {}).values():
        peft_config.base_model_name_or_path = m.name  # public name, not a local cache path
    policy.model.train()
    if ctx.active:  # distinct dropout masks per rank from here on
        torch.manual_seed(init_seed + 7919 * ctx.rank)
    params = [prm for prm in policy.model.parameters() if prm.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.train.learning_rate,
                                  weight_decay=config.train.weight_decay)
    rollout_gen = torch.Generator().manual_seed(seed + 2 + 7919 * ctx.rank) if seed is not None else None
    return RunState(config=config, run_dir=run_dir, device=device, slots=slots, n=n, q=q,
                    delta=delta, sigma=sigma, clip_norm=clip,
                    sampler=PoissonSampler(n, q, seed=seed),
                    noise=NoiseSource(seed=None if seed is None else seed + 1, device=device),
                    policy=policy, optimizer=optimizer, task=task,
                    num_canaries=config.audit.canaries, _rollout_gen=rollout_gen)


def certificate(run: RunState, ledger: PrivacyLedger, round_done: int) -> dict[str, Any]:
    """The privacy certificate written to release/certificate.json."""
    cfg = run.config
    eps = ledger.epsilon(run.delta) if cfg.private else math.inf
    rdp, order = ledger.rdp_epsilon(run.delta) if cfg.private else (math.inf, math.nan)
    releasable = cfg.private and not run.seeded and run.noise.releasable and run.sampler.releasable
    cert: dict[str, Any] = {
        "epsilon": eps, "delta": run.delta, "private": cfg.private, "arm": cfg.train.arm,
        "q": run.q, "sigma": run.sigma, "clip_norm": run.clip_norm, "n": run.n,
        "expected_batch": run.expected_batch, "steps": cfg.train.steps,
        "rounds_retained": round_done, "rounds_charged": ledger.rounds,
        "neighbouring_relation": NEIGHBOURING_RELATION, "unit": "one prompt (problem + reference answer)",
        "accountant": ACCOUNTANT, "accountant_version": accountant_version(),
        "rdp_epsilon": rdp, "rdp_order": order, "ledger": ledger.to_dict(),
        "seeded": run.seeded, "releasable": releasable, "noise": "secure" if run.noise.secure else "seeded",
        "model": cfg.model.name, "task": cfg.data.task, "group_size": cfg.train.group_size,
        "canary_slots": run.num_canaries, "dpgrpo_version": __version__, "assumptions": ASSUMPTIONS,
        "budget_independent_of": ["group size G", "clipping norm C", "loss", "verifier"],
        "shared_budget": ("every arm (dp-grpo, zero-advantage, ladder, filtered-sft, gold-sft) run "
                          f"with n = {run.n}, q = {run.q:.6g}, sigma = {run.sigma:.10g}, "
                          f"T = {cfg.train.steps} and delta = {run.delta:.6g} has exactly this "
                          "epsilon: only the per-record gradient differs (Corollary 2)"),
    }
    if cfg.private and math.isfinite(eps):
        # replace-one and a person's k prompts, accounted at the same delta (privacy/figures.py)
        cert.update(neighbour_figures(ledger.events, run.delta, cfg.privacy.group_sizes))
        if cfg.privacy.noise_multiplier is None:
            cert["target_epsilon"] = cfg.privacy.epsilon
    if not releasable:
        cert["not_releasable_because"] = (
            "non-private arm (sigma = 0)" if not cfg.private else
            "seeded generators (privacy.seed): sampling coins and noise are reproducible")
    return cert


__all__ = ["RunState", "build_run", "certificate", "compute_epsilon", "resolve_device"]
