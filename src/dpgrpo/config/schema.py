"""Run configuration: one frozen dataclass per concern, each validated in ``__post_init__``.

A TOML file has the sections ``[model]``, ``[data]``, ``[privacy]``, ``[train]`` and ``[audit]``;
reading it, typing each value by its field and ``--set section.key=value`` overrides are
:mod:`dpgrpo.config.loading`. Unknown keys and inconsistent values raise
:class:`dpgrpo.errors.ConfigError` naming the key. Every public input of Algorithm 1 is here and
must be chosen without looking at the private data (assumption A1). docs/config.md is generated
from the field comments here (:mod:`dpgrpo.config.reference`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dpgrpo.config.arms import FOCAL_ARM, ArmName, arm_spec
from dpgrpo.config.json_types import JSON
from dpgrpo.config.losses import LOSS_TYPES, SCALE_REWARDS, LossType, ScaleRewards, refuse
from dpgrpo.config.sigma_floor import check_accountable_sigma
from dpgrpo.config.values import check_choices, check_finite
from dpgrpo.errors import ConfigError, PrivacyBudgetError, PrivacyError

#: the choices of the run config's string keys, one Literal each (the loader and
#: :func:`dpgrpo.config.values.check_choices` refuse anything else, listing them)
Dtype = Literal["float32", "bfloat16", "float16", "float64"]
LoraTrain = Literal["all", "B", "bias"]
InitKeep = Literal["all", "A"]
KLReference = Literal["start", "base"]
Source = Literal["local", "hub"]
PrivacyUnit = Literal["prompt", "contributor"]
GradMethod = Literal["auto", "fast", "reference"]
BatchSampling = Literal["poisson", "fixed"]
RolloutIsolation = Literal["batched", "isolated"]
Engine = Literal["transformers", "vllm"]          # rollout engines (dpgrpo.rollout.factory)
MetricsBackend = Literal["jsonl", "tensorboard", "wandb"]   # dpgrpo.training.metrics' sinks
#: metrics backends that send rows off the machine
OFF_MACHINE = frozenset({"wandb"})

MAX_GROUP_SIZE = 8
#: model.lora_train -> what it trains and what stays frozen (stated in the certificate)
LORA_TRAIN: dict[LoraTrain, str] = {
    "all": "lora_A and lora_B (rank x (d_in + d_out) per module)",
    "B": "lora_B only (FFA-LoRA, Sun et al. 2024): lora_A frozen at its initialization, "
         "so the update is B times a fixed projection (d_out x rank per module)",
    "bias": "lora_B's bias only: one vector of d_out per module added to its output "
            "(a steering vector); lora_A and lora_B's weight frozen",
}  # certificate group figures cost about k^2 seconds at every checkpoint
#: model.kl_reference -> the policy pi_ref of the KL term (Eq. 3)
KL_REFERENCE: dict[KLReference, str] = {
    "start": "the policy the run starts from: the public warm start when model.init_adapter "
             "keeps all its weights, else the base model (a fresh adapter's lora_B is zero, so "
             "both are the same function); the standard GRPO reference (the initial policy)",
    "base": "the base model with the adapter switched off (TRL's reference for a PEFT model), "
            "also from a warm start: the KL term then pulls the run back from the warm start "
            "towards the base",
}
#: model.init_adapter_keep -> which weights of the public warm start the run starts from
INIT_KEEP: dict[InitKeep, str] = {
    "all": "every weight of the warm start (the run starts at the warm-started model)",
    "A": "the warm start's lora_A only; lora_B (and its bias) start at zero, so the run starts "
         "at the base model and, with lora_train = 'B', learns inside the public run's input "
         "projections (a public subspace, as in GEP and FFA-LoRA)",
}
@dataclass(frozen=True)
class ModelConfig:
    """The public base model and the LoRA adapter (paper, Appendix C-A)."""

    name: str = "smollm2-135m"  # a hub id, a local folder, a .gguf file or the alias smollm2-135m
    dtype: Dtype = "float32"  # base weights; loss, clipping, noise and AdamW stay in fp32
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda", "cuda:N" or "mps"
    lora_rank: int = 4  # r of the LoRA adapter (Appendix C-A: 4)
    lora_alpha: float = 8.0  # LoRA scale alpha (the update is alpha / r * B A)
    lora_dropout: float = 0.05  # LoRA dropout; each prompt's masks come from its own stream
    # modules that get an adapter (default: the seven attention and MLP projections)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj")
    gradient_checkpointing: bool = False  # recompute decoder layers in backward (less memory)
    # decoder layers that get adapters (negative indices count from the end; default: all; an
    # empty list is refused). Fewer trainable coordinates p means less noise per unit of
    # signal (sigma C sqrt(p)/(q n)).
    lora_layers: tuple[int, ...] | None = None
    # Which adapter weights the private run trains (model.LORA_TRAIN; public): "all" (A and B),
    # "B" (FFA-LoRA: A frozen at its initialization) or "bias" (only B's bias, needs lora_bias:
    # one steering vector per adapted module). Fewer trainable coordinates, less noise.
    lora_train: LoraTrain = "all"
    lora_bias: bool = False  # give lora_B a bias (PEFT's lora_bias), zero at start
    # A public adapter to start from (a folder with adapter_model.safetensors, e.g. the release/
    # of a run on public data). Public input: its path and sha256 go into the certificate.
    init_adapter: str | None = None
    # Which of the warm start's weights to keep (INIT_KEEP): "all", or "A" (lora_B reset to 0).
    init_adapter_keep: InitKeep = "all"
    # The KL term's reference policy (KL_REFERENCE): "start" (the policy the run starts from,
    # the warm start if there is one) or "base" (the adapter switched off, as TRL does for PEFT).
    kl_reference: KLReference = "start"

    def __post_init__(self) -> None:
        check_finite(self, "model")
        check_choices(self, "model")
        if not self.lora_alpha > 0:
            raise ConfigError(f"model.lora_alpha must be > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"model.lora_dropout must lie in [0, 1), got {self.lora_dropout}")
        if self.init_adapter_keep != "all" and self.init_adapter is None:
            raise ConfigError("model.init_adapter_keep = 'A' keeps part of a warm start: set "
                              "model.init_adapter to the public adapter's folder")
        if self.lora_train == "bias" and not self.lora_bias:
            raise ConfigError("model.lora_train = 'bias' trains lora_B's bias only: "
                              "set model.lora_bias = true too")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) \
                or self.lora_rank < 1:
            raise ConfigError(f"model.lora_rank must be an integer >= 1, got {self.lora_rank!r}")
        modules = tuple(self.target_modules)
        if not modules or not all(isinstance(m, str) and m for m in modules):
            raise ConfigError("model.target_modules must be a non-empty list of module names")
        if len(set(modules)) != len(modules):
            raise ConfigError(f"model.target_modules has duplicates: {list(modules)}")
        object.__setattr__(self, "target_modules", modules)
        if self.lora_layers is not None:
            layers = tuple(self.lora_layers)
            if not layers:
                raise ConfigError("model.lora_layers = [] adapts no layer: list the decoder "
                                  "layers to adapt, or leave the key out to adapt every layer")
            if len(set(layers)) != len(layers):
                raise ConfigError(f"model.lora_layers has duplicates: {list(layers)}")
            object.__setattr__(self, "lora_layers", layers)


@dataclass(frozen=True)
class DataConfig:
    """The private prompts and the public slot universe."""

    # a built-in task (arithmetic, gsm8k, math, csqa, svamp, code, humaneval, ...) or
    # "module:OBJECT" (your task object or factory; docs/usage.md)
    task: str = "arithmetic"
    data_dir: str | None = None  # the benchmarks' folder, laid out like ../shared/data
    split: str = "train"  # the split trained on (eval runs use the task's eval split)
    source: Source = "local"  # or "hub" (Hugging Face datasets, needs internet)
    # Public pre-processing: train on the first `limit` valid problems of the split; `limit`
    # is also a public capacity, n = limit (+ canaries) unless n_slots is set. Refused with
    # privacy_unit = "contributor" (truncation would couple contributors; issue 32).
    limit: int | None = None
    # Public pre-processing: train on these problems of the split (0-based positions among its
    # valid problems, as `dpgrpo audit mia`'s TASK:SPLIT[i,j,...] counts them), in this order; a
    # public capacity like `limit` (n = len(indices) + canaries unless n_slots is set). The
    # study sets it to its randomly drawn audit members (issue 58). Not with `limit`.
    indices: tuple[int, ...] | None = None
    skip_invalid: bool = False  # skip invalid records instead of stopping; n does not shrink
    # Public n. Default: data.limit or len(data.indices) (+ canaries), else the split's size
    # (the embedded task's, or the source file's raw row count with invalid rows as absent
    # slots) (+ canaries).
    # Required with privacy_unit = "contributor" (the contributor count is private; issue 32).
    n_slots: int | None = None
    # The unit of privacy (dpgrpo.privacy.contributors): "prompt" (one problem with its
    # reference answer) or "contributor" (all problems of one contributor: n = data.n_slots
    # contributor slots, and a sampled contributor uses at most per_contributor of its problems
    # per round).
    privacy_unit: PrivacyUnit = "prompt"
    contributors: str | None = None  # mapping file problem id -> contributor (.jsonl or .csv)
    per_contributor: int = 4  # k (public): problems of a sampled contributor used per round

    def __post_init__(self) -> None:
        check_finite(self, "data")
        check_choices(self, "data")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"data.limit must be >= 1, got {self.limit}")
        if self.indices is not None:
            self._check_indices()
        if self.n_slots is not None and self.n_slots < 1:
            raise ConfigError(f"data.n_slots must be >= 1, got {self.n_slots}")
        if self.per_contributor < 1:
            raise ConfigError(f"data.per_contributor must be >= 1, got {self.per_contributor}")
        if self.privacy_unit == "contributor" and self.limit is not None:
            raise ConfigError(
                f"data.limit = {self.limit} with data.privacy_unit = 'contributor': truncating "
                "the problems before grouping them makes one contributor's removal change other "
                "contributors' records (and pull in a new one), which the one-contributor "
                "epsilon does not cover; remove data.limit, give only the problems to train on, "
                "and fix n with data.n_slots")
        if self.privacy_unit == "contributor" and self.n_slots is None:
            raise ConfigError(
                "data.privacy_unit = 'contributor' needs data.n_slots, the public number of "
                "contributor slots n: counting the contributors in the data or the mapping file "
                "would make n depend on the private data (n must be public, assumption A1); set "
                "data.n_slots to a public upper bound on the contributors (+ canaries)")
        if self.contributors is not None and self.privacy_unit != "contributor":
            raise ConfigError("data.contributors maps problems to contributors for "
                              "data.privacy_unit = 'contributor'; set that too, or remove it")

    def _check_indices(self) -> None:
        idx = tuple(self.indices or ())
        if not idx:
            raise ConfigError("data.indices = [] trains on no problem: list the 0-based "
                              "positions of the split's problems to train on, or remove the key")
        bad = [i for i in idx if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ConfigError(f"data.indices must be integers >= 0 (0-based positions in the "
                              f"split), got {bad[0]!r} among {list(idx)}")
        if len(set(idx)) != len(idx):
            from collections import Counter

            dup = sorted(i for i, c in Counter(idx).items() if c > 1)
            raise ConfigError(f"data.indices has duplicates: {dup} (each problem fills one slot)")
        if self.limit is not None:
            raise ConfigError(f"data.indices and data.limit = {self.limit} both choose the "
                              "problems trained on: give one of them")
        if self.privacy_unit == "contributor":
            raise ConfigError("data.indices with data.privacy_unit = 'contributor': choosing "
                              "problems before grouping them couples contributors (as "
                              "data.limit would); give only the problems to train on")
        object.__setattr__(self, "indices", idx)

    @property
    def capacity(self) -> int | None:
        """The public capacity the problems were chosen by: len(indices), else limit."""
        return len(self.indices) if self.indices is not None else self.limit

    def select(self, problems: Sequence[object]) -> list[Any]:
        """The problems a prompt-level run trains on: ``problems[i]`` for each of
        ``data.indices`` (an index past the split is refused, naming the key), else the first
        ``data.limit``, else all."""
        if self.indices is not None:
            past = [i for i in self.indices if i >= len(problems)]
            if past:
                raise ConfigError(f"data.indices lists {past[:5]} but split {self.split!r} of "
                                  f"{self.task!r} has {len(problems)} valid problems "
                                  f"(positions 0..{len(problems) - 1})")
            return [problems[i] for i in self.indices]
        return list(problems[:self.limit] if self.limit is not None else problems)


@dataclass(frozen=True)
class PrivacyConfig:
    """(epsilon, delta) target and the mechanism's public parameters (Table I)."""

    epsilon: float = 8.0  # target epsilon: sigma is calibrated to it at delta over T rounds
    delta: float | None = None  # default 1 / (10 n); a releasable run needs delta < 1 / n
    expected_batch: float = 128.0  # m = q n
    # C: each prompt's gradient is clipped to this L2 norm (at most 1e6: larger ones overflow
    # the fp32 step; dpgrpo.config.values.MAXIMA holds every key's upper bound)
    clip_norm: float = 0.055
    noise_multiplier: float | None = None  # None: calibrated from epsilon
    seed: int | None = None  # debugging only: a seeded run is not releasable
    group_sizes: tuple[int, ...] = (2, 3)  # certificate: k prompts of one person (2..8)

    def __post_init__(self) -> None:
        check_finite(self, "privacy")
        if not self.epsilon > 0:
            raise ConfigError(f"privacy.epsilon must be > 0, got {self.epsilon}")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"privacy.seed must be >= 0, got {self.seed}")
        ks = self.group_sizes
        if any(isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= MAX_GROUP_SIZE
               for k in ks) or len(set(ks)) != len(ks):
            raise ConfigError(f"privacy.group_sizes must be distinct integers in [2, "
                              f"{MAX_GROUP_SIZE}] (k = 1 is epsilon itself; larger k: "
                              f"`dpgrpo privacy convert --group K`), got {list(ks)}")
        if not self.expected_batch > 0:
            raise ConfigError(f"privacy.expected_batch must be > 0, got {self.expected_batch}")
        if not self.clip_norm > 0:
            raise ConfigError(f"privacy.clip_norm must be > 0, got {self.clip_norm}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ConfigError(f"privacy.delta must lie in (0, 1), got {self.delta}")
        if self.noise_multiplier is not None and self.noise_multiplier < 0:
            raise ConfigError(f"privacy.noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.noise_multiplier:
            check_accountable_sigma(self.noise_multiplier, "privacy.noise_multiplier")


@dataclass(frozen=True)
class TrainConfig:
    """Algorithm 1's loop and the objective (Section VII-A)."""

    # what each sampled record computes (config.arms.ARMS: dp-grpo, zero-advantage, ...)
    arm: ArmName = FOCAL_ARM
    rounds: int = 50  # T: the rounds of Algorithm 1 (one Poisson-sampled batch each; <= 10^6)
    group_size: int = 8  # G
    temperature: float = 0.7  # sampling temperature of the G completions
    # Sampler (dpgrpo.rollout.sampling, both engines): nucleus filtering and CTRL's repetition
    # penalty on the prompt and the completion so far, in transformers' order. 1.0: off.
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # CTRL's penalty (1.0: off)
    max_new_tokens: int | None = None  # default: the task's completion cap
    beta: float = 0.04  # weight of the k3 KL term to the frozen base (Eq. 7)
    # The per-prompt loss's token normaliser (LOSS_TYPES) and the advantages' scale
    # (SCALE_REWARDS); Dr. GRPO is loss_type = "dr_grpo" with scale_rewards = "none".
    loss_type: LossType = "grpo"
    scale_rewards: ScaleRewards = "group"  # "group" (divide by the group's std) or "none"
    # Eq. (7)'s log-probs and Eq. (3)'s KL on the tempered policy softmax(logits / temperature),
    # the distribution the completions were sampled from: an on-policy gradient, as TRL and
    # verl compute it. False: the model's own distribution (temperature 1).
    tempered_logprobs: bool = False
    # Multiply each token's KL estimate (Eq. 3) by the ratio exp(u - sg(u)), 1 in value: the KL
    # gradient per token becomes beta (u - u_ref) grad u, the sequence KL's, instead of Eq. (3)'s
    # beta (1 - pi_ref/pi) grad u. TRL's use_bias_correction_kl (True by default in TRL 1.16).
    kl_bias_correction: bool = False
    # Leave completions that hit the cap (no EOS) out of the loss (DAPO's overlong masking):
    # a per-row rule on the prompt's own rollouts; their rewards still enter the group's mean.
    mask_truncated_completions: bool = False
    learning_rate: float = 3e-4  # AdamW's, on the trainable LoRA weights (at most 1)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    # Clip the norm of each round's update to this before the AdamW step (TRL's max_grad_norm).
    # In the private arms the update is the noisy mean, so this is post-processing of the
    # mechanism's output and costs no privacy; in the non-private arm it clips the batch's mean
    # gradient, as TRL does. None: no clip.
    max_update_norm: float | None = None
    # "auto": the fast LoRA-hook path, or the reference path under gradient checkpointing
    # (autograd then saves only each layer's input: ~6x less memory than the hooks' stashes)
    grad_method: GradMethod = "auto"
    # Compute the frozen layers below the lowest adapted one once per prompt window: the
    # reference pass keeps their output for the gradient pass (dpgrpo.objectives.trunk). Costs
    # B x (prompt + G x completion) hidden states of memory; false recomputes them.
    share_frozen_layers: bool = True
    # Gold SFT: the frozen layers' states of each record kept across rounds (a record's window
    # is the same every round), up to this many MiB; 0 recomputes them every round
    frozen_layer_cache_mb: int = 512
    # rows of ONE prompt per training/reference pass (default: from max_tokens_per_pass below)
    rows_per_pass: int | None = None
    rollout_batch_size: int | None = None  # rows per generate call (default: 16 passes' rows)
    checkpoint_every: int = 10  # rounds between checkpoints (recovery/) and releases (release/)
    clip_nonprivate: bool = True  # non-private arm: keep clipping at C
    # "poisson" (Algorithm 1, every arm); "fixed": exactly round(q n) distinct prompts a round,
    # as TRL takes (non-private arms only: the accountant's bound needs Poisson sampling)
    batch_sampling: BatchSampling = "poisson"
    # Memory budget of one forward/backward pass, counted in completion-cap tokens: a pass holds
    # rows_per_pass = max(1, max_tokens_per_pass // cap) rows of ONE prompt. Public: it never
    # depends on the data, and results depend on it only through summation order.
    max_tokens_per_pass: int = 512
    rollout_isolation: RolloutIsolation = "batched"  # or "isolated": one generate call per prompt
    # Sample with the adapter unmerged and its LoRA dropout firing on every decoded token, as
    # TRL's GRPOTrainer samples in train mode (transformers engine). A call's masks come from a
    # stream of its prompts' seeds, so a private arm needs rollout_isolation = "isolated"
    # (each prompt's masks its own); false samples the merged adapter without dropout.
    rollout_dropout: bool = False
    # Gradient and reference passes run a prompt's tokens once for its G rows (one LoRA-dropout
    # mask for the prompt's tokens, shared by its rows); false runs every row whole (one mask
    # per row, as TRL does; G times the prompt's compute). Values agree without dropout.
    share_prompt_pass: bool = True
    rollout_engine: Engine = "transformers"  # or "vllm" (GPU; pip install 'dpgrpo[vllm]')
    # transformers engine on CUDA: constant-shape decoding steps replayed as a CUDA graph
    # (dpgrpo.rollout.graphs; checked against the eager step at every capture)
    cuda_graphs: bool = True
    # Fix glibc's mmap threshold so RSS returns to baseline after every pass
    # (dpgrpo.training.runtime): memory stays at one pass's peak at ~1.4x the CPU time; false keeps
    # glibc's default.
    bound_memory: bool = True
    # Opt-in logs of public values per round (round, T, epsilon): "jsonl"
    # (RUN_DIR/metrics.jsonl), "tensorboard", "wandb" (dpgrpo.training.metrics)
    metrics: tuple[MetricsBackend, ...] = ()
    # Also log wall-clock times (elapsed, time/round, time/<phase>) to train.metrics. They
    # REVEAL THE REALIZED BATCH SIZE (time/reference tracks it at +0.996 on a quiet machine), a
    # side channel outside the guarantee; default: private, in recovery/telemetry.jsonl. A
    # releasable run refuses them with "wandb" (off the machine).
    public_timings: bool = False

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the policy in the GRPO loss (``tempered_logprobs``)."""
        return self.temperature if self.tempered_logprobs else 1.0

    def pass_rows(self, cap: int) -> int:
        """Rows per training/reference pass for completion cap ``cap`` (public values only):
        ``rows_per_pass`` if set, else ``max(1, max_tokens_per_pass // cap)``."""
        if self.rows_per_pass is not None:
            return self.rows_per_pass
        return max(1, self.max_tokens_per_pass // max(1, cap))

    def engine_options(self) -> dict[str, object]:
        """Options of ``rollout_engine`` taken from this table."""
        if self.rollout_engine != "transformers":
            return {}
        return {"cuda_graphs": self.cuda_graphs, "sample_dropout": self.rollout_dropout}

    def rollout_rows(self, cap: int) -> int:
        """Rows per generate call: ``rollout_batch_size`` if set, else 16 passes' worth, in
        whole groups of G."""
        if self.rollout_batch_size is not None:
            return self.rollout_batch_size
        return max(self.group_size, 16 * self.pass_rows(cap) // self.group_size * self.group_size)

    def __post_init__(self) -> None:
        spec = arm_spec(self.arm)  # ConfigError naming train.arm for an unknown arm
        check_finite(self, "train")
        for name in ("rounds", "group_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ConfigError(f"train.learning_rate must be > 0, got {self.learning_rate}")
        if self.beta < 0:
            raise ConfigError(f"train.beta must be >= 0, got {self.beta}")
        if not self.temperature > 0:
            raise ConfigError(f"train.temperature must be > 0, got {self.temperature}: GRPO "
                              "compares G sampled completions of each prompt, and greedy "
                              "decoding (0) makes them identical, so every advantage is zero")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_update_norm is not None and not self.max_update_norm > 0:
            raise ConfigError(f"train.max_update_norm must be > 0 (or unset: no clip), got "
                              f"{self.max_update_norm}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"train.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (0.0 < self.top_p <= 1.0 and self.repetition_penalty > 0.0):
            raise ConfigError("train.top_p must lie in (0, 1] and train.repetition_penalty be "
                              f"> 0, got {self.top_p} and {self.repetition_penalty}")
        if self.loss_type not in LOSS_TYPES:
            refuse("loss_type", self.loss_type, LOSS_TYPES)
        if self.scale_rewards not in SCALE_REWARDS:
            refuse("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        check_choices(self, "train")
        if self.rollout_dropout and self.rollout_engine != "transformers":
            raise ConfigError("train.rollout_dropout needs train.rollout_engine = 'transformers' "
                              f"(the {self.rollout_engine!r} engine samples the merged adapter)")
        if spec.normalizes_groups and self.group_size < 2:
            raise ConfigError(f"train.group_size = {self.group_size} with arm {self.arm!r}: GRPO "
                              "normalizes rewards within each prompt's group of G completions, "
                              "so with G = 1 every advantage is zero; use G >= 2")
        if self.max_tokens_per_pass < 1:
            raise ConfigError(
                f"train.max_tokens_per_pass must be >= 1, got {self.max_tokens_per_pass}"
            )
        if self.frozen_layer_cache_mb < 0:
            raise ConfigError("train.frozen_layer_cache_mb must be >= 0, got "
                              f"{self.frozen_layer_cache_mb}")
        for name in ("rows_per_pass", "rollout_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class AuditConfig:
    """Canaries for the one-run audit (Steinke et al. 2023); their slots count in n."""

    canaries: int = 0  # canary slots for the one-run audit (the last of the n slots)
    canary_seed: int = 0  # public: canary content is not secret, their inclusion bits are

    def __post_init__(self) -> None:
        check_finite(self, "audit")
        for name in ("canaries", "canary_seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"audit.{name} must be >= 0, got {getattr(self, name)}")


def check_timing_sinks(backends: tuple[str, ...], timings: bool, releasable: bool) -> None:
    """Refuse wall-clock times on an off-machine sink in a releasable run (ConfigError): they
    reveal each round's realized batch size, and W&B keeps them on someone else's server."""
    off = sorted(set(backends) & OFF_MACHINE)
    if timings and releasable and off:
        raise ConfigError(f"train.public_timings = true with train.metrics = {off}: per-phase "
                          "times reveal each round's realized batch size, and a releasable run "
                          "does not send them off the machine; use jsonl or tensorboard, or "
                          "set train.public_timings = false")


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def __post_init__(self) -> None:
        check_timing_sinks(self.train.metrics, self.train.public_timings, self.releasable)
        if self.private and self.train.batch_sampling != "poisson":
            raise PrivacyBudgetError(
                f"train.batch_sampling = {self.train.batch_sampling!r} with the private arm "
                f"{self.train.arm!r}: the certificate's bound is for Poisson sampling (Algorithm "
                "1, line 2); a fixed-size batch is for the non-private arm only")
        if self.private and self.train.rollout_dropout \
                and self.train.rollout_isolation != "isolated":
            raise PrivacyError(
                f"train.rollout_dropout with the private arm {self.train.arm!r} and batched "
                "rollouts: prompts decoded in one call would share a dropout stream, so one "
                "record's presence would change another's masks; set train.rollout_isolation "
                "= 'isolated'")
        if not self.private:
            if self.privacy.noise_multiplier not in (None, 0.0):
                raise ConfigError(f"train.arm = {self.train.arm!r} uses sigma = 0; "
                                  "remove privacy.noise_multiplier")
        elif self.privacy.noise_multiplier == 0.0:
            raise ConfigError(
                f"arm {self.train.arm!r} is private: privacy.noise_multiplier must be > 0 "
                "(use train.arm = 'non-private' for sigma = 0)"
            )

    @property
    def private(self) -> bool:
        """Whether the arm adds noise (sigma > 0) and certifies an epsilon (the arm table)."""
        return arm_spec(self.train.arm).private

    @property
    def releasable(self) -> bool:
        """Whether the run can be released as configured: a private arm, no debugging seed."""
        return self.private and self.privacy.seed is None

    def to_dict(self, *, public: bool = True) -> JSON:
        """Plain dict; with ``public`` the debugging seed is replaced by whether one was set."""
        out = dataclasses.asdict(self)
        if public:
            out["privacy"]["seeded"] = out["privacy"].pop("seed") is not None
        return out

