"""Old formats of a run directory and a release, read in one place (light: no torch at import).

A run directory or a release written by an older dpgrpo outlives the names it was written
with; every reader of an old name is here, so the rest of the package reads current names only:

* :func:`as_written`: a saved ``recovery/config.json`` with the settings its run ran under
  (``train.chunk_size`` and ``train.steps`` renamed, ``model.kl_reference`` missing);
* :func:`release_config_path`: a release written before 0.2 named its public config
  ``config.json`` (:data:`LEGACY_RELEASE_CONFIG`), which ``from_pretrained`` mistook for a
  model config;
* :func:`certified_rounds`: certificates written by 0.2.0 or earlier name the rounds T
  ``steps``.

One old format is read where it is used: the privacy journal's checksum-less lines (the first
journal format, one charged round each) are counted by :func:`dpgrpo.privacy.journal.scan`
itself, because the privacy core sits below this layer and a reader that skipped them would
under-count the rounds charged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpgrpo.config.json_types import JSONValue

RELEASE_CONFIG = "dpgrpo_config.json"
LEGACY_RELEASE_CONFIG = "config.json"  # releases written before dpgrpo 0.2

#: ``train`` keys renamed since a run directory may have been saved: old name -> new name
RENAMED_TRAIN = {"chunk_size": "rows_per_pass", "steps": "rounds"}

_REQUIRED = object()


def as_written(data: dict[str, object]) -> dict[str, object]:
    """A saved config with the settings its run ran under, where a key is newer than the run.

    - ``model.kl_reference`` (0.2.x): a run saved without it that started from a warm start
      took its KL reference with the adapter switched off, so it resumes with ``"base"``;
    - ``train.rows_per_pass`` (0.2.x) was ``train.chunk_size``;
    - ``train.rounds`` (0.2.x) was ``train.steps``.
    """
    out = dict(data)
    model = out.get("model")
    if isinstance(model, dict) and "kl_reference" not in model and model.get("init_adapter"):
        out["model"] = {**model, "kl_reference": "base"}
    train = out.get("train")
    if isinstance(train, dict):
        for old, new in RENAMED_TRAIN.items():
            if old in train:
                train = {**{k: v for k, v in train.items() if k != old},
                         new: train.get(new, train[old])}
        out["train"] = train
    return out


def release_config_path(release_dir: str | Path) -> Path:
    """Where a release keeps dpgrpo's config: the current name, or an old release's
    ``config.json`` when only that exists (and is not a model's config)."""
    release_dir = Path(release_dir)
    current, legacy = release_dir / RELEASE_CONFIG, release_dir / LEGACY_RELEASE_CONFIG
    if not current.exists() and legacy.exists():
        try:
            data = json.loads(legacy.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return legacy  # damaged: let the reader name it
        if isinstance(data, dict) and "model_type" not in data:
            return legacy
    return current


def certified_rounds(cert: Mapping[str, object], default: object = _REQUIRED) -> JSONValue:
    """The rounds T a certificate was issued for: its ``rounds``, or ``steps`` in a certificate
    written by dpgrpo 0.2.0 or earlier (a released run directory outlives the name). Neither:
    ``default`` if given, else KeyError naming ``rounds``."""
    if "rounds" in cert:
        return cert["rounds"]
    if "steps" in cert:
        return cert["steps"]
    if default is _REQUIRED:
        raise KeyError("rounds")
    return default


__all__ = ["LEGACY_RELEASE_CONFIG", "RELEASE_CONFIG", "RENAMED_TRAIN", "as_written",
           "certified_rounds", "release_config_path"]
