"""Checkpoints: what may be released and what must stay private (paper, Section IV, A-G (A3)).

A run directory holds two trees:

* ``release/``: the LoRA adapter (PEFT format), the resolved public configuration
  (``config.json``) and ``certificate.json``. Only names on :data:`RELEASE_FILES` may be written
  there; anything else raises :class:`ReleaseError`.
* ``recovery/``: optimizer state, the privacy journal, generator states and per-round training
  telemetry (rewards, losses, lengths: private training-time data). Publishing it would void the
  guarantee.

Every write is atomic: files go to a temporary name and are moved into place with
``os.replace``; a checkpoint directory is complete before the ``latest`` pointer names it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from dpgrpo.errors import ConfigError, ReleaseError
from dpgrpo.privacy.accounting import PrivacyLedger, RoundEvent

RELEASE_FILES = frozenset({"adapter_model.safetensors", "adapter_config.json", "config.json",
                           "certificate.json", "README.md"})


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


class PrivacyJournal:
    """Durable, append-only record of every round that touched data (invariant 5).

    The trainer charges a round *before* it samples: a line is appended and fsynced. A resumed
    run rebuilds its ledger from the journal, so rounds that were lost and replayed are charged
    twice, never zero times.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def charge(self, round_index: int, sampling_rate: float, noise_multiplier: float) -> None:
        line = json.dumps({"round": round_index, "sampling_rate": sampling_rate,
                           "noise_multiplier": noise_multiplier})
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def ledger(self) -> PrivacyLedger:
        ledger = PrivacyLedger()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    e = json.loads(line)
                    ledger.record(e["sampling_rate"], e["noise_multiplier"])
        return ledger

    def entries(self) -> int:
        return self.ledger().rounds


def write_release(release_dir: Path, *, model: Any, config: dict[str, Any],
                  certificate: dict[str, Any]) -> None:
    """Write the release atomically: build it beside the target, then swap directories."""
    parent = release_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".release-"))
    try:
        with warnings.catch_warnings():  # PEFT looks for the base's config.json to compare
            warnings.filterwarnings("ignore", message="Could not find a config file")
            model.save_pretrained(str(tmp))
        atomic_write_json(tmp / "config.json", config)
        atomic_write_json(tmp / "certificate.json", certificate)
        atomic_write_text(tmp / "README.md", _release_readme(certificate))
        stray = sorted(p.name for p in tmp.iterdir() if p.name not in RELEASE_FILES)
        if stray:
            raise ReleaseError(f"refusing to release unexpected files {stray}: only "
                               f"{sorted(RELEASE_FILES)} may leave the curator")
        old = parent / ".release-old"
        if old.exists():
            shutil.rmtree(old)
        if release_dir.exists():
            os.replace(release_dir, old)
        os.replace(tmp, release_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _release_readme(cert: dict[str, Any]) -> str:
    eps = cert.get("epsilon")
    status = ("releasable" if cert.get("releasable") else
              "NOT releasable (seeded generators or a non-private arm)")
    protects = ""
    if isinstance(cert.get("replace_one"), dict):  # what each figure protects (privacy/figures.py)
        def fig(f: dict[str, Any]) -> str:
            return f"({f.get('epsilon'):.4g}, {f.get('delta'):.3g}) [{f.get('method')}]"

        groups = "; ".join(f"k = {g.get('group')}: {fig(g)}" for g in cert.get("group_privacy", []))
        protects = (
            f"What each figure protects, all at the same delta: epsilon = {eps} protects one "
            "problem (with its reference answer) added to or removed from the training set; "
            f"replace-one {fig(cert['replace_one'])} protects one problem swapped for another; "
            f"a person who contributed k problems, all added or removed together, is protected "
            f"at {groups or 'no group size listed (privacy.group_sizes)'}. Larger k weakens the "
            "guarantee; `dpgrpo privacy convert --ledger certificate.json --delta DELTA --group K` "
            "computes any k.\n\n")
    return (f"# dpgrpo release\n\nLoRA adapter for `{cert.get('model')}` trained with arm "
            f"`{cert.get('arm')}`.\n\nGuarantee: ({eps}, {cert.get('delta')})-DP with respect to "
            f"adding or removing one training prompt (n = {cert.get('n')} public slots), "
            f"{cert.get('rounds_charged')} rounds of the Poisson-subsampled Gaussian mechanism "
            f"(q = {cert.get('q')}, sigma = {cert.get('sigma')}), accounted with "
            f"{cert.get('accountant')}. Status: {status}.\n\n{protects}Load with "
            "`peft.PeftModel.from_pretrained(base_model, this_directory)`; see certificate.json.\n")


def save_recovery(recovery_dir: Path, round_done: int, *, model: Any,
                  optimizer: torch.optim.Optimizer, generators: dict[str, Any],
                  extra: dict[str, Any]) -> Path:
    """Write ``recovery/step-XXXXXX`` atomically and point ``recovery/latest`` at it."""
    recovery_dir.mkdir(parents=True, exist_ok=True)
    final = recovery_dir / f"step-{round_done:06d}"
    tmp = Path(tempfile.mkdtemp(dir=recovery_dir, prefix=".step-"))
    try:
        adapter = {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}
        torch.save({"round_done": round_done, "adapter": adapter,
                    "optimizer": optimizer.state_dict(), "generators": generators, **extra},
                   tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(recovery_dir / "latest", final.name + "\n")
    for old in sorted(recovery_dir.glob("step-*"))[:-2]:  # keep the last two checkpoints
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_recovery(recovery_dir: Path) -> dict[str, Any] | None:
    """The latest complete recovery checkpoint, or None if the run never checkpointed."""
    pointer = recovery_dir / "latest"
    if not pointer.exists():
        return None
    state_path = recovery_dir / pointer.read_text().strip() / "state.pt"
    if not state_path.exists():
        raise ConfigError(f"{pointer} names a checkpoint that does not exist: {state_path}")
    return torch.load(state_path, map_location="cpu", weights_only=False)


def restore_adapter(model: Any, adapter: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable tensors back into the model (names must match exactly)."""
    params = {k: v for k, v in model.named_parameters() if v.requires_grad}
    if set(params) != set(adapter):
        raise ConfigError("recovery checkpoint does not match the model's trainable parameters")
    with torch.no_grad():
        for name, value in adapter.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


__all__ = ["PrivacyJournal", "RELEASE_FILES", "RoundEvent", "atomic_write_json",
           "atomic_write_text", "load_recovery", "restore_adapter", "save_recovery",
           "write_release"]
