"""Writing the release folder: adapter, public config, certificate and model card, atomically.

Only names on :data:`dpgrpo.release.files.RELEASE_FILES` may be written there (anything else
raises :class:`ReleaseError`), the folder is built beside the target and swapped in whole, and
the certificate records the sha256 of the adapter's files, which push and resume verify. An
adapter with a non-finite entry is refused (:class:`ReleaseError`): a NaN adapter certifies
nothing useful, and the trainer's invariant 3 should have kept every weight finite.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import ReleaseError
from dpgrpo.release.files import MACHINE_FIELDS, RELEASE_CONFIG, RELEASE_FILES, WITHHELD_FIELDS
from dpgrpo.rundir.atomic import (
    atomic_write_json,
    atomic_write_text,
    disk_full_guard,
    fsync_dir,
    fsync_file,
    sha256_file,
)

if TYPE_CHECKING:
    import torch


def write_release(release_dir: Path, *, model: torch.nn.Module, config: JSON,
                  certificate: JSON) -> None:
    """Write the release atomically: build it beside the target, then swap directories."""
    parent = release_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    with disk_full_guard(release_dir):
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".release-"))
        try:
            _build_release(tmp, model, config, certificate)
            old = parent / ".release-old"
            if old.exists():
                shutil.rmtree(old)
            if release_dir.exists():
                os.replace(release_dir, old)
            os.replace(tmp, release_dir)
            fsync_dir(parent)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _build_release(tmp: Path, model: Any, config: JSON,
                   certificate: JSON) -> None:
    with warnings.catch_warnings():  # PEFT looks for the base's config.json to compare
        warnings.filterwarnings("ignore", message="Could not find a config file")
        warnings.filterwarnings("ignore", message="Unable to fetch remote file")
        # The LoRA never resizes the vocabulary: no need to save (or look up) embeddings.
        model.save_pretrained(str(tmp), save_embedding_layers=False)
    check_finite_adapter(tmp / "adapter_model.safetensors")
    atomic_write_json(tmp / RELEASE_CONFIG, public_config(config))
    digests = {name: sha256_file(tmp / name)  # checked by push and by resume
               for name in ("adapter_model.safetensors", "adapter_config.json")}
    atomic_write_json(tmp / "certificate.json", {**certificate, "files_sha256": digests})
    atomic_write_text(tmp / "README.md", _model_card(tmp) + _release_readme(certificate))
    stray = sorted(p.name for p in tmp.iterdir() if p.name not in RELEASE_FILES)
    if stray:
        raise ReleaseError(f"refusing to release unexpected files {stray}: only "
                           f"{sorted(RELEASE_FILES)} may leave the curator")
    for path in tmp.iterdir():
        fsync_file(path)


def public_config(config: Mapping[str, object]) -> JSON:
    """``config`` as a release publishes it: each :data:`~dpgrpo.release.files.MACHINE_FIELDS`
    value that is a path of this machine becomes ``"local model <basename>"`` (the model, the
    warm start) or ``"local data <basename>"`` (the data folder, the contributors file); an
    alias or hub id stays. A model path also logs a warning: whoever loads the release must
    supply that base (``dpgrpo.load_release(..., base=...)``). ``data.indices`` (which problems
    were trained on) is withheld: only their count is published. The full config stays in
    ``recovery/config.json``, from which :func:`dpgrpo.release.files.run_config` reads it back."""
    from dpgrpo.model import is_machine_path, public_name

    out = {section: dict(values) if isinstance(values, dict) else values
           for section, values in config.items()}
    for section, key in MACHINE_FIELDS:
        values = out.get(section)
        if not isinstance(values, dict):
            continue
        value = values.get(key)
        if not isinstance(value, str) or not is_machine_path(value):
            continue
        if section == "model":
            values[key] = public_name(value)  # training's start warned (public_model_name)
        else:
            path = Path(value).expanduser()
            values[key] = f"local data {path.name or path.resolve().name or 'data'}"
    for section, key in WITHHELD_FIELDS:   # which problems were trained on: never published
        values = out.get(section)
        if isinstance(values, dict) and isinstance(values.get(key), list):
            values[key] = f"withheld: {len(values[key])} chosen problems"
    return out


def check_finite_adapter(path: Path) -> None:
    """Refuse (:class:`ReleaseError`) an adapter file with a NaN or infinite entry, naming the
    tensors; this reads back exactly the tensors that would be released."""
    from safetensors.torch import load_file

    bad = sorted(name for name, t in load_file(str(path)).items()
                 if t.is_floating_point() and not bool(t.isfinite().all()))
    if bad:
        raise ReleaseError(f"refusing to release an adapter with non-finite weights: {len(bad)} "
                           f"tensor(s) hold NaN or inf ({', '.join(bad[:3])}"
                           f"{', ...' if len(bad) > 3 else ''}); release/ keeps its previous "
                           "content (report this: the trainer skips non-finite steps)")


def _model_card(release: Path) -> str:
    """YAML front matter of the model card: PEFT's own (base_model, library_name: peft,
    pipeline_tag, tags) with the base named by its public name, plus dpgrpo's tags."""
    from huggingface_hub import ModelCardData
    from huggingface_hub.repocard import metadata_load

    card = release / "README.md"  # PEFT's, written by save_pretrained
    meta = (metadata_load(card) if card.exists() else None) or {}
    adapter = json.loads((release / "adapter_config.json").read_text())
    base = adapter.get("base_model_name_or_path") or meta.get("base_model")
    if base:
        from dpgrpo.model import LOCAL_MODEL, public_name

        base = public_name(str(base))  # a folder of this machine: "local model <basename>"
        if base.startswith(LOCAL_MODEL):  # not a hub id: the card's text names it instead
            base = None
    tags = [t for t in meta.get("tags", []) if not str(t).startswith("base_model:")]
    meta.pop("base_model", None)
    if base:
        meta["base_model"] = base
    meta["library_name"] = "peft"
    meta.setdefault("pipeline_tag", "text-generation")
    meta["tags"] = [*([f"base_model:adapter:{base}"] if base else []), *tags,
                    *(t for t in ("dpgrpo", "differential-privacy", "grpo") if t not in tags)]
    return f"---\n{ModelCardData(**meta).to_yaml()}\n---\n\n"


def _release_readme(cert: JSON) -> str:
    from dpgrpo.release.check import format_delta, format_epsilon

    # people read rounded figures; certificate.json keeps the exact values
    eps, delta = format_epsilon(cert.get("epsilon")), format_delta(cert.get("delta"))
    status = ("releasable" if cert.get("releasable") else
              "NOT releasable (seeded generators or a non-private arm)")
    protects = ""
    if isinstance(
        cert.get("replace_one"), dict
    ):  # what each figure protects (privacy/neighbours.py)

        def fig(f: Mapping[str, object]) -> str:
            return (f"({format_epsilon(f.get('epsilon'))}, {format_delta(f.get('delta'))}) "
                    f"[{f.get('method')}]")

        groups = "; ".join(f"k = {g.get('group')}: {fig(g)}" for g in cert.get("group_privacy", []))
        protects = (
            "What each figure protects, all accounted at the same delta (each with the "
            f"noise-tail term at its own epsilon): epsilon = {eps} protects one "
            "problem (with its reference answer) added to or removed from the training set; "
            f"replace-one {fig(cert['replace_one'])} protects one problem swapped for another; "
            f"a person who contributed k problems, all added or removed together, is protected "
            f"at {groups or 'no group size listed (privacy.group_sizes)'}. Larger k weakens the "
            "guarantee; `dpgrpo privacy convert --ledger certificate.json --delta DELTA --group K` "
            "computes any k.\n\n")
    return (f"# dpgrpo release\n\nLoRA adapter for `{cert.get('model')}` trained with arm "
            f"`{cert.get('arm')}`.\n\nGuarantee: ({eps}, {delta})-DP with respect to "
            f"adding or removing one training prompt (n = {cert.get('n')} public slots), "
            f"{cert.get('rounds_charged')} rounds of the Poisson-subsampled Gaussian mechanism "
            f"(q = {_figure(cert.get('q'))}, sigma = {_figure(cert.get('sigma'))}), accounted with "
            f"{cert.get('accountant')}. Status: {status}.\n\n{protects}Check it with "
            "`dpgrpo release check this_directory` (files against the certificate's sha256, "
            "finite weights, epsilon recomputed). Load it with "
            "`dpgrpo.load_release(this_directory)` (the base as trained, offline for the alias "
            "`smollm2-135m`), `peft.PeftModel.from_pretrained(base_model, this_directory)`, "
            "`peft.AutoPeftModelForCausalLM.from_pretrained(this_directory)` or (with peft "
            "installed) `transformers.AutoModelForCausalLM.from_pretrained(this_directory)` "
            "(these two fetch the base named above from the hub); "
            f"see certificate.json and {RELEASE_CONFIG} (the public training config).\n")


def _figure(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


__all__ = ["check_finite_adapter", "public_config", "write_release"]
