"""Checkpoints: what may be released and what must stay private (paper, Section IV, A-G (A3)).

A run directory holds two trees:

* ``release/``: the LoRA adapter (PEFT format), the resolved public configuration
  (``dpgrpo_config.json``: not ``config.json``, which transformers would read as the model's),
  ``certificate.json`` and a model card (``README.md``: PEFT's metadata, base model by its
  public hub id, and the certificate's summary). Only names on :data:`RELEASE_FILES` may be
  written there; anything else raises :class:`ReleaseError`.
* ``recovery/``: optimizer state, the privacy journal (:mod:`dpgrpo.privacy.journal`),
  generator states and per-round training telemetry (rewards, losses, lengths: private
  training-time data). Publishing it would void the guarantee. Its folders are 0700 and its
  files 0600 (:func:`~dpgrpo.rundir.atomic.private_dir`).

Every write is atomic and durable: files go to a temporary name, are fsynced and moved into
place with ``os.replace``; a checkpoint directory is complete before ``latest`` names it, and
the last two checkpoints are kept so that a damaged newest one falls back to the one before
(:func:`load_checkpoint`). A full disk raises :class:`DiskFullError` naming the place; a
half-written release is never moved into ``release/``. Temporaries left by a kill are removed
by :func:`remove_temporaries` on the next start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from dpgrpo.errors import ConfigError, RecoveryError
from dpgrpo.rundir.atomic import (
    PRIVATE_FILE,
    atomic_write_json,
    atomic_write_text,
    disk_full_guard,
    fsync_dir,
    fsync_file,
    private_dir,
    sha256_file,
)

KEEP_CHECKPOINTS = 2
_STEP = re.compile(r"step-(\d{6,})")


def remove_temporaries(run_dir: Path) -> list[str]:
    """Delete what a killed write left behind (``.step-*``, ``.release-*``, ``.tmp-*``)."""
    found = [p for p in run_dir.glob(".release-*")]
    recovery = run_dir / "recovery"
    if recovery.is_dir():
        found += [p for p in recovery.iterdir() if p.name.startswith(".")]
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return sorted(p.name for p in found)


def save_recovery(recovery_dir: Path, round_done: int, *, model: object,
                  optimizer: torch.optim.Optimizer, generators: Mapping[str, object],
                  extra: Mapping[str, object]) -> Path:
    """Write ``recovery/step-XXXXXX`` atomically and point ``recovery/latest`` at it.

    ``step-XXXXXX/meta.json`` repeats ``round_done`` and the ledger (``extra["ledger"]``) so
    that resume can read what every checkpoint proves without loading it.
    """
    private_dir(recovery_dir)
    final = recovery_dir / f"step-{round_done:06d}"
    with disk_full_guard(final):
        tmp = Path(tempfile.mkdtemp(dir=recovery_dir, prefix=".step-"))
        try:
            adapter = {k: v.detach().cpu() for k, v in _restorable(model).items()}
            torch.save({"round_done": round_done, "adapter": adapter,
                        "optimizer": optimizer.state_dict(), "generators": generators, **extra},
                       tmp / "state.pt")
            os.chmod(tmp / "state.pt", PRIVATE_FILE)  # torch.save follows the umask (0644)
            fsync_file(tmp / "state.pt")
            atomic_write_json(tmp / "meta.json", {"round_done": round_done,
                                                  "ledger": extra.get("ledger"),
                                                  "state_sha256": sha256_file(tmp / "state.pt")})
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(recovery_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(recovery_dir / "latest", final.name + "\n")
    for old in checkpoint_dirs(recovery_dir)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_dirs(recovery_dir: Path) -> list[Path]:
    """``step-XXXXXX`` directories, oldest first (by round, not by name)."""
    if not recovery_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in recovery_dir.iterdir()
             if p.is_dir() and (m := _STEP.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


@dataclass
class Checkpoint:
    """The newest intact checkpoint, and the newer ones that were damaged."""

    path: Path
    state: dict[str, Any]
    damaged: list[str] = field(default_factory=list)

    @property
    def round_done(self) -> int:
        return int(self.state["round_done"])


def _load_state(path: Path) -> dict[str, object]:
    _verify_digest(path)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    keys = {"round_done", "adapter", "optimizer", "generators"}
    if not isinstance(state, dict) or not keys <= state.keys():
        raise ValueError("not a dpgrpo checkpoint")
    step = cast(re.Match[str], _STEP.fullmatch(path.name))    # a checkpoint_dirs() name
    if int(state["round_done"]) != int(step.group(1)):
        raise ValueError(f"holds round {state['round_done']}")
    return state


def _verify_digest(path: Path) -> None:
    """Compare ``state.pt`` with the sha256 its ``meta.json`` recorded when it was written: a
    flipped byte inside a tensor still unpickles, and training would go on from corrupted
    weights. Checkpoints written before digests were recorded are loaded unchecked."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # meta.json is a hint (resume reads the ledger from the journal too)
    digest = meta.get("state_sha256") if isinstance(meta, dict) else None
    if digest is not None and sha256_file(path / "state.pt") != digest:
        raise ValueError("sha256 differs from the one recorded in meta.json: the file is damaged")


def load_checkpoint(recovery_dir: Path) -> Checkpoint | None:
    """The newest checkpoint that loads, falling back over damaged ones (None: no checkpoint).

    ``latest`` is only a hint: a complete ``step-XXXXXX`` directory exists before ``latest``
    names it, so the newest directory that loads is the one to resume from. If every
    checkpoint is damaged, :class:`RecoveryError` names them.
    """
    damaged: list[str] = []
    for path in reversed(checkpoint_dirs(recovery_dir)):
        try:
            return Checkpoint(path, _load_state(path), damaged)
        except Exception as err:  # truncated zip, unpickling, missing file, ...
            damaged.append(f"{path / 'state.pt'} ({type(err).__name__}: {_short(err)})")
    if damaged:
        raise RecoveryError(
            f"no intact checkpoint in {recovery_dir}: {'; '.join(damaged)}. To start over from "
            "round 0 (rounds already charged stay charged), remove the step-* folders")
    pointer = recovery_dir / "latest"
    if pointer.exists():
        raise RecoveryError(
            f"{pointer} names {pointer.read_text(errors='replace').strip()!r} "
            "but no checkpoint folder exists; remove it to start over from round 0 (rounds "
            "already charged stay charged)"
        )
    return None


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:120] + ("..." if len(text) > 120 else "")


def _restorable(model: Any) -> dict[str, torch.nn.Parameter]:
    """The trainable parameters and every adapter weight, frozen ones included: a frozen
    lora_A (model.lora_train = "B") was drawn at start-up and a resumed run must keep it."""
    from dpgrpo.model_adapters import adapter_parameters, trainable_parameters

    trainable = trainable_parameters(model)
    return {**adapter_parameters(model), **trainable}


def restore_adapter(model: object, adapter: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors back into the model (names must match exactly)."""
    params = _restorable(model)
    if set(params) != set(adapter):
        raise ConfigError("recovery checkpoint does not match the model's trainable parameters")
    with torch.no_grad():
        for name, value in adapter.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


__all__ = [
    "KEEP_CHECKPOINTS",
    "Checkpoint",
    "checkpoint_dirs",
    "load_checkpoint",
    "remove_temporaries",
    "restore_adapter",
    "save_recovery",
]
