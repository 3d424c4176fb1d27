"""A run's release/: its file names, and reading it back (light: no torch at import).

``release/dpgrpo_config.json`` holds dpgrpo's resolved public configuration. The old names a
release may have been written with (``config.json`` before 0.2, a certificate's ``steps`` for T
until 0.2.0) are read by :mod:`dpgrpo.rundir.migrate`; :func:`read_release_config` and
:func:`certified_rounds` are re-exported from there.

Writing it is :mod:`dpgrpo.release.write`; publishing it, :mod:`dpgrpo.release.publish`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DataError, ReleaseError
from dpgrpo.rundir.layout import (
    LEGACY_RELEASE_CONFIG,
    RELEASE_CONFIG,
    RELEASE_DIR,
    read_release_config,
    release_config_path,
    verify_release_files,
)
from dpgrpo.rundir.migrate import certified_rounds

#: Everything release/ may hold (release.write.write_release refuses anything else).
RELEASE_FILES = frozenset({"adapter_model.safetensors", "adapter_config.json", RELEASE_CONFIG,
                           "certificate.json", "README.md"})
#: Public-config fields that may hold a path of the training machine. A release publishes them
#: as ``"local model <name>"`` / ``"local data <name>"``
#: (:func:`dpgrpo.release.write.public_config`), never the path; :func:`run_config` reads the path
#: back from ``recovery/`` on that machine.
MACHINE_FIELDS = (("model", "name"), ("model", "init_adapter"), ("data", "data_dir"),
                  ("data", "contributors"))
#: fields a release never publishes: ``data.indices`` lists which problems were trained on,
#: exactly what the guarantee hides (it reads ``withheld: k chosen problems``); recovery/ keeps it
WITHHELD_FIELDS = (("data", "indices"),)


def release_dir_of(path: str | Path) -> Path:
    """``path/release`` for a run directory, else ``path`` itself (a release directory)."""
    path = Path(path)
    return path / RELEASE_DIR if (path / RELEASE_DIR).is_dir() else path


def run_config(path: str | Path) -> JSON:
    """The release's public config as this machine can use it: for a run directory whose
    ``recovery/config.json`` is here, the fields a release publishes without their path
    (:data:`MACHINE_FIELDS`: the model folder, the warm start, the data folder, the
    contributors file) and those it withholds (:data:`WITHHELD_FIELDS`: the chosen problems)
    come from that full config; a release on its own stays as published."""
    release = Path(path) / RELEASE_DIR if (Path(path) / RELEASE_DIR).is_dir() else Path(path)
    config = read_release_config(release)
    try:
        full = json.loads((release.parent / "recovery" / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return config
    for section, key in MACHINE_FIELDS + WITHHELD_FIELDS:
        public, private = config.get(section), full.get(section) if isinstance(full, dict) else None
        if isinstance(public, dict) and isinstance(private, dict) and key in private:
            config[section] = {**public, key: private[key]}
    return config


class EvalDefaults(TypedDict, total=False):
    """What :func:`eval_defaults` reads from a run (``dpgrpo eval --run``): its release config's
    values, and the release folder as the adapter."""

    model: str
    task: str
    adapter: Path
    arm: str
    data_dir: str | None
    source: str
    dtype: str
    device: str
    engine: str


def eval_defaults(run_dir: str | Path) -> EvalDefaults:
    """What ``dpgrpo eval --run`` takes from a training run: model, task, adapter, arm,
    data_dir, source, dtype, device and rollout engine of its release config (:func:`run_config`:
    the model and data folders of this machine from recovery/)."""
    release = Path(run_dir) / RELEASE_DIR
    config = run_config(run_dir)
    try:
        model, data, train = config["model"], config["data"], config["train"]
        return {"model": model["name"], "task": data["task"], "adapter": release,
                "arm": train["arm"], "data_dir": data.get("data_dir"),
                "source": data.get("source", "local"), "dtype": model.get("dtype", "float32"),
                "device": model.get("device", "auto"),
                "engine": train.get("rollout_engine", "transformers")}
    except (KeyError, TypeError) as err:
        raise DataError(f"unreadable release config (missing {err})",
                        path=str(release_config_path(release))) from None


def read_certificate(release_dir: Path) -> dict[str, object]:
    """``certificate.json`` as a dict; a damaged one (not UTF-8, not JSON, not an object, no
    epsilon) is a ReleaseError naming the file: nothing is published on a guess."""
    path = release_dir / "certificate.json"
    try:
        cert = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ReleaseError(f"{path} is damaged ({' '.join(str(err).split())[:120]}); "
                           "re-create the release with dpgrpo train --resume RUN_DIR") from None
    if not isinstance(cert, dict) or "epsilon" not in cert or "releasable" not in cert:
        raise ReleaseError(f"{path} is damaged (not a certificate: no epsilon/releasable); "
                           "re-create the release with dpgrpo train --resume RUN_DIR")
    return cert


__all__ = ["LEGACY_RELEASE_CONFIG", "MACHINE_FIELDS", "RELEASE_CONFIG", "RELEASE_DIR",
           "RELEASE_FILES", "certified_rounds", "eval_defaults", "read_certificate",
           "read_release_config", "release_config_path", "release_dir_of", "run_config",
           "verify_release_files"]
