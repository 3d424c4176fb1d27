"""The privacy certificate (release/certificate.json): what a run guarantees and on what terms.

:func:`certificate` turns a run's public constants and its ledger into the certificate; the
assumptions it rests on (:data:`ASSUMPTIONS`), what crashes reveal (:data:`CRASHES`), how the
run kept records apart (:func:`record_isolation`) and what the adapter trained
(:func:`adapter_statement`) are stated in it, word for word.
"""

from __future__ import annotations

import math
from typing import Protocol

from dpgrpo import __version__
from dpgrpo.config import ModelConfig, RunConfig
from dpgrpo.config.arms import ARMS, arm_spec
from dpgrpo.config.json_types import JSON
from dpgrpo.privacy.accounting import (
    ACCOUNTANT,
    NEIGHBOURING_RELATION,
    PrivacyLedger,
    accountant_version,
)
from dpgrpo.privacy.contributors import CONTRIBUTOR, unit_description
from dpgrpo.privacy.neighbours import neighbour_figures
from dpgrpo.privacy.noise import GENERATOR, NoiseSource, noise_tail_delta
from dpgrpo.privacy.record_coins import GENERATOR as RECORD_GENERATOR
from dpgrpo.privacy.record_coins import RecordRandomness
from dpgrpo.privacy.sampling import N_SOURCES, PoissonSampler


class CertifiedRun(Protocol):
    """What :func:`certificate` reads of a run: its config, public constants and generators.

    :class:`dpgrpo.training.setup.RunState` is one; release/ sits below training/ (docs/
    architecture.md, Layers), so the certificate names the fields it reads, not the trainer's
    state.
    """

    config: RunConfig
    noise: NoiseSource
    sampler: PoissonSampler
    coins: RecordRandomness
    n_source: str
    coordinates: int              # d: trainable coordinates, each noised every round (public)
    num_canaries: int
    init_adapter_sha256: str | None

    @property
    def n(self) -> int: ...
    @property
    def q(self) -> float: ...
    @property
    def delta(self) -> float: ...
    @property
    def sigma(self) -> float: ...
    @property
    def clip_norm(self) -> float: ...
    @property
    def expected_batch(self) -> float: ...
    @property
    def seeded(self) -> bool: ...

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
    "worst case (train.max_new_tokens, train.rollout_batch_size, train.rows_per_pass sized for G "
    "completions of the longest prompt at the token cap).")


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
                      init_sha256: str | None = None) -> dict[str, object]:
    """What the adapter trains, what stays frozen and where it started (the certificate's
    ``adapter``): every coordinate of ``trainable_coordinates`` is noised every round."""
    from dpgrpo.config import KL_REFERENCE, LORA_TRAIN
    from dpgrpo.model import public_name

    init = None if model.init_adapter is None else {
        "path": public_name(model.init_adapter),  # never a path of this machine
        "sha256": init_sha256, "keep": model.init_adapter_keep,
        "public_input": "a warm start is public input (assumption A1): it must have been "
                        "trained without this run's private data; the guarantee covers what "
                        "this run adds to it"}
    return {"lora_train": model.lora_train, "trains": LORA_TRAIN[model.lora_train],
            "trainable_coordinates": coordinates, "lora_rank": model.lora_rank,
            "lora_bias": model.lora_bias, "target_modules": list(model.target_modules),
            "lora_layers": None if model.lora_layers is None else list(model.lora_layers),
            "init_adapter": init, "kl_reference": model.kl_reference,
            "kl_reference_is": KL_REFERENCE[model.kl_reference]}


def certificate(run: CertifiedRun, ledger: PrivacyLedger, round_done: int) -> JSON:
    """The privacy certificate written to release/certificate.json."""
    from dpgrpo.model import public_name  # an alias or hub id as it is; never a machine path

    cfg = run.config
    arm = arm_spec(cfg.train.arm)
    eps = ledger.epsilon(run.delta) if cfg.private else math.inf
    rdp, order = ledger.rdp_epsilon(run.delta) if cfg.private else (math.inf, math.nan)
    releasable = (cfg.private and not run.seeded and run.noise.releasable
                  and run.sampler.releasable and run.coins.releasable)
    tail = noise_tail_delta(run.coordinates, ledger.rounds, eps) if cfg.private else 0.0
    cert: dict[str, object] = {
        "epsilon": eps,
        "delta": run.delta + tail,
        "delta_pld": run.delta,
        "noise_tail_delta": tail,
        "private": cfg.private,
        "arm": cfg.train.arm,
        "q": run.q,
        "sigma": run.sigma,
        "clip_norm": run.clip_norm,
        "n": run.n,
        "n_source": N_SOURCES[run.n_source],
        "expected_batch": run.expected_batch,
        "rounds": cfg.train.rounds,
        "rounds_retained": round_done,
        "rounds_charged": ledger.rounds,
        "rounds_replayed": ledger.rounds - round_done,
        "crashes": CRASHES,
        "neighbouring_relation": NEIGHBOURING_RELATION,
        "unit": unit_description(cfg.data.privacy_unit, cfg.data.per_contributor),
        "accountant": ACCOUNTANT,
        "accountant_version": accountant_version(),
        "rdp_epsilon": rdp,
        "rdp_order": order,
        "ledger": ledger.to_dict(),
        "seeded": run.seeded,
        "releasable": releasable,
        "noise": "secure" if run.noise.secure else "seeded",
        "noise_generator": GENERATOR,
        "record_randomness": RECORD_GENERATOR,
        "trainable_coordinates": run.coordinates,
        "adapter": adapter_statement(cfg.model, run.coordinates, run.init_adapter_sha256),
        "model": public_name(cfg.model.name),
        "task": cfg.data.task,
        "group_size": cfg.train.group_size,
        "canary_slots": run.num_canaries,
        "dpgrpo_version": __version__,
        "assumptions": ASSUMPTIONS,
        "record_isolation": record_isolation(
            cfg.train.rollout_isolation, cfg.train.rollout_engine, cfg.data.privacy_unit
        ),
        "budget_independent_of": ["group size G", "clipping norm C", "loss", "verifier"],
        "shared_budget": (
            f"every private arm ({', '.join(a for a in ARMS if ARMS[a].private)}) "
            f"run with n = {run.n}, q = {run.q:.6g}, sigma = {run.sigma:.10g}, "
            f"T = {cfg.train.rounds} and delta = {run.delta:.6g} has exactly this "
            "epsilon: only the per-record gradient differs (Corollary 2); this "
            f"run's arm, {arm.name}: {arm.description}"
        ),
    }
    if cfg.private and math.isfinite(eps):
        # replace-one and a person's k prompts, accounted at the same delta_pld, each delta
        # with the noise-tail term at its own epsilon like the headline (privacy/neighbours.py)
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


__all__ = ["ASSUMPTIONS", "CRASHES", "adapter_statement", "certificate", "record_isolation"]
