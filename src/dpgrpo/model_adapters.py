"""The LoRA adapter that DP-GRPO trains: its settings, attaching it, and what it keeps.

:mod:`dpgrpo.model` finds and loads the public base model; this module is what is put on it
and trained (Section III-C, "Low-rank adaptation"): :class:`LoraSettings` (a ``[model]``
table's adapter under short names), :func:`attach_lora` (B = 0 at start, only LoRA
trainable, kept in fp32), the warm start from a public adapter (:func:`load_init_adapter`),
the weights ``model.lora_train`` keeps frozen (:func:`freeze_adapter`,
:func:`frozen_adapter_names`) and the KL term's reference policy (:func:`keep_reference`,
:func:`reference_policy`). It imports no loading code, so the trainer's per-prompt gradients,
the objectives and the checkpoints can use the adapter without the model loader; every name
is also importable from :mod:`dpgrpo.model`.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dpgrpo.config import ModelConfig
from dpgrpo.config.schema import InitKeep, KLReference, LoraTrain
from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from peft import PeftModel

# PEFT asks transformers for `is_gradient_checkpointing`, which transformers 5 deprecates; the
# warning says nothing actionable to a dpgrpo user.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# model.lora_bias on bias-free layers: PEFT warns that it could not merge (dpgrpo never merges
# through PEFT) and, on saving, mistakes the 1-D lora_B biases for unsharded FSDP tensors.
warnings.filterwarnings("ignore", message=".*`lora_bias=True` was passed but the targeted layer")
warnings.filterwarnings("ignore", message=r".*LoRA tensor\(s\) have invalid shape: \S*lora_B\.bias")

_DEFAULT = ModelConfig()  # the one source of the adapter's defaults and checks


@dataclass(frozen=True)
class LoraSettings:
    """The adapter of a ``[model]`` table under short names (rank 4 on the seven attention and
    MLP projections by default: paper, Appendix C-A). Defaults and checks are
    :class:`~dpgrpo.config.ModelConfig`'s: building one validates it as that config would."""

    rank: int = _DEFAULT.lora_rank
    alpha: float = _DEFAULT.lora_alpha
    dropout: float = _DEFAULT.lora_dropout
    target_modules: tuple[str, ...] = _DEFAULT.target_modules
    layers: tuple[int, ...] | None = _DEFAULT.lora_layers  # negative: from the end
    train: LoraTrain = _DEFAULT.lora_train            # config.LORA_TRAIN: which weights train
    bias: bool = _DEFAULT.lora_bias             # lora_B has a bias (PEFT's lora_bias)
    init_adapter: str | None = _DEFAULT.init_adapter  # public adapter folder to start from
    init_keep: InitKeep = _DEFAULT.init_adapter_keep  # config.INIT_KEEP: "all" or "A"
    kl_reference: KLReference = _DEFAULT.kl_reference  # config.KL_REFERENCE: "start" or "base"

    def __post_init__(self) -> None:
        checked = replace(_DEFAULT, lora_rank=self.rank, lora_alpha=self.alpha,
                          lora_dropout=self.dropout, target_modules=self.target_modules,
                          lora_layers=self.layers, lora_train=self.train, lora_bias=self.bias,
                          init_adapter=self.init_adapter, init_adapter_keep=self.init_keep,
                          kl_reference=self.kl_reference)
        object.__setattr__(self, "target_modules", checked.target_modules)

    @classmethod
    def from_config(cls, model: ModelConfig) -> LoraSettings:
        """The adapter a run's ``[model]`` table asks for (``model.lora_*``,
        ``model.target_modules``, ``model.lora_layers``)."""
        return cls(rank=model.lora_rank, alpha=model.lora_alpha, dropout=model.lora_dropout,
                   target_modules=tuple(model.target_modules), layers=model.lora_layers,
                   train=model.lora_train, bias=model.lora_bias,
                   init_adapter=model.init_adapter, init_keep=model.init_adapter_keep,
                   kl_reference=model.kl_reference)


def _adapter_dtype(model: torch.nn.Module) -> torch.dtype:
    base = next(model.parameters()).dtype
    return torch.promote_types(base, torch.float32)  # fp32, or fp64 for fp64 test models


def keep_lora_precise(model: torch.nn.Module) -> None:
    dtype = _adapter_dtype(model)
    for name, param in model.named_parameters():
        if "lora_" in name and param.dtype != dtype:
            param.data = param.data.to(dtype)


def attach_lora(model: torch.nn.Module, lora: LoraSettings = LoraSettings()) -> PeftModel:
    """Wrap ``model`` in a PEFT LoRA adapter: B = 0 at start, only LoRA trainable, fp32."""
    from peft import LoraConfig, get_peft_model

    layers = None
    if lora.layers is not None:
        total = int(getattr(model.config, "num_hidden_layers", 0))
        layers = sorted({i % total if total else i for i in lora.layers})
        if not total or any(not -total <= i < total for i in lora.layers):
            raise ConfigError(f"model.lora_layers {list(lora.layers)} out of range for a model "
                              f"with {total} decoder layers")
    config = LoraConfig(r=lora.rank,
                        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft: int, used as float
                        lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), bias="none",
                        task_type="CAUSAL_LM", layers_to_transform=layers,
                        lora_bias=lora.bias)
    found = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in lora.target_modules if m not in found]
    if missing:
        raise ConfigError(f"model.target_modules not found in the model: {missing}")
    peft_model = get_peft_model(model, config)
    keep_lora_precise(peft_model)
    if lora.init_adapter is not None:
        load_init_adapter(peft_model, lora.init_adapter, keep=lora.init_keep)
        if lora.kl_reference == "start" and lora.init_keep == "all":
            keep_reference(peft_model)
    freeze_adapter(peft_model, lora.train)
    return peft_model


REFERENCE_ATTR = "_dpgrpo_reference"


def keep_reference(model: torch.nn.Module) -> None:
    """Make the adapter's weights as they are now the KL term's reference (a warm start).

    A copy of every adapter weight is kept on the model; :func:`reference_policy` computes with
    it. It is public: the warm start is public input, and the copy is taken before any round.
    """
    start = {n: p.detach().clone() for n, p in adapter_parameters(model).items()}
    object.__setattr__(model, REFERENCE_ATTR, start)


@contextmanager
def reference_policy(model: torch.nn.Module) -> Iterator[None]:
    """Run the enclosed no-grad passes as the KL term's reference policy pi_ref.

    A model with a kept reference (:func:`keep_reference`: a warm start under
    ``model.kl_reference = "start"``) computes with those adapter weights, and gets its own
    back bit for bit afterwards, also on an error; any other PEFT model with its adapter
    disabled (the base model: a fresh adapter's lora_B is zero, so it is also the start); a
    plain model as it is.
    """
    start: dict[str, torch.Tensor] | None = getattr(model, REFERENCE_ATTR, None)
    if start is None:
        disable = getattr(model, "disable_adapter", None)
        with disable() if disable is not None else nullcontext():
            yield
        return
    params = adapter_parameters(model)
    if set(params) != set(start):
        raise ConfigError("the kept KL reference does not match the model's adapter weights")
    now = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(start[name])
        yield
    finally:
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(now[name])


def _trains(name: str, train: str) -> bool:
    """Whether adapter parameter ``name`` is trained under ``model.lora_train = train``."""
    if train == "all":
        return True
    if train == "B":
        return ".lora_B." in name
    return ".lora_B." in name and name.endswith(".bias")


def freeze_adapter(model: torch.nn.Module, train: str) -> None:
    """Freeze the adapter weights that ``model.lora_train`` does not train (config.LORA_TRAIN).

    A frozen weight keeps its initial value, which depends on no data (a seeded or OS-entropy
    random init, or the public ``init_adapter``) and is released with the adapter.
    """
    frozen = frozenset(n for n in adapter_parameters(model) if not _trains(n, train))
    if len(frozen) == len(adapter_parameters(model)):
        raise ConfigError(f"model.lora_train = {train!r} leaves no trainable parameter")
    # PEFT sets requires_grad on every adapter weight again whenever the adapter is switched
    # back on (``disable_adapter`` for the reference pass), so the flag alone cannot hold a
    # freeze: the names are kept on the model and :func:`frozen_adapter_names` reapplies it.
    object.__setattr__(model, FROZEN_ATTR, frozen)
    frozen_adapter_names(model)


FROZEN_ATTR = "_dpgrpo_frozen"


def frozen_adapter_names(model: torch.nn.Module) -> frozenset[str]:
    """The adapter weights ``model.lora_train`` keeps frozen, frozen again (requires_grad off)."""
    frozen: frozenset[str] = getattr(model, FROZEN_ATTR, frozenset())
    if frozen:
        for name, param in model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
    return frozen


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every parameter of the LoRA adapter, trained or frozen (what recovery/ must restore)."""
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Name -> parameter for every parameter that requires grad, less the adapter weights
    ``model.lora_train`` freezes (which PEFT may have switched back on: frozen again here).
    The per-prompt gradients (:mod:`dpgrpo.training.grads`, which re-exports it) are taken
    with respect to these; recovery/ checkpoints restore them."""
    frozen = frozen_adapter_names(model)
    return {n: p for n, p in model.named_parameters() if p.requires_grad and n not in frozen}


def adapter_digest(path: str | Path) -> str:
    """sha256 of a saved adapter's weights file (the certificate's record of a public input)."""
    return hashlib.sha256((Path(path) / ADAPTER_WEIGHTS).read_bytes()).hexdigest()


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def load_init_adapter(model: torch.nn.Module, path: str | Path, *, keep: str = "all") -> None:
    """Copy a saved public adapter's weights into ``model``'s fresh adapter, every one of them;
    with ``keep = "A"`` every lora_B weight and bias is then set to zero, so the model is the
    base model again and only the public lora_A projections remain (config.INIT_KEEP).

    The saved adapter must have exactly this adapter's parameters and shapes (same rank,
    modules, layers and lora_bias): a partial warm start would leave part of the adapter at a
    random init without saying so.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = Path(path) / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConfigError(f"model.init_adapter: {weights} not found (give a folder holding "
                          f"{ADAPTER_WEIGHTS}, e.g. a run's release/)")
    try:
        state = load_file(str(weights))
    except Exception as err:  # safetensors raises its own error types
        raise ConfigError(f"model.init_adapter: {weights} is not a readable safetensors "
                          f"file ({type(err).__name__})") from None
    before = {n: p.detach().clone() for n, p in adapter_parameters(model).items()}
    try:
        result = set_peft_model_state_dict(model, state)
    except RuntimeError as err:  # shape mismatch
        raise ConfigError(f"model.init_adapter: {weights} does not fit the configured adapter "
                          f"({' '.join(str(err).split())[:200]})") from None
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [n for n in before if n in set(getattr(result, "missing_keys", []) or [])]
    if unexpected or missing or len(state) != len(before):
        raise ConfigError(f"model.init_adapter: {weights} holds {len(state)} tensors for an "
                          f"adapter of {len(before)} (unexpected {unexpected[:3]}, missing "
                          f"{missing[:3]}); use the same lora_rank, target_modules, lora_layers "
                          "and lora_bias as the run that saved it")
    if keep == "A":
        with torch.no_grad():
            for name, param in adapter_parameters(model).items():
                if ".lora_B." in name:
                    param.zero_()
    keep_lora_precise(model)
