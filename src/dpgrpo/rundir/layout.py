"""The layout of a run directory, in one place (light: no torch at import).

::

    RUN_DIR/release/    what may be published (release.RELEASE_FILES): adapter, public config,
                        certificate.json, model card
    RUN_DIR/recovery/   private: config.json/.toml (full), journal.jsonl and its twin
                        journal-twin.jsonl, ledger.json, telemetry.jsonl, canaries.json,
                        step-XXXXXX/ checkpoints
    RUN_DIR/.lock       the writer's pid (runlock.py)

:class:`RunDir` names these paths and reads what others read from a run: the public config,
the certificate and whether the release is complete, and the release's file names (the
release package, above this one, re-exports them from :mod:`dpgrpo.release.files`). Writers
(checkpoint.py, the trainer, privacy/journal.py) take their paths from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DataError, ReleaseError
from dpgrpo.rundir.atomic import sha256_file
from dpgrpo.rundir.migrate import LEGACY_RELEASE_CONFIG, RELEASE_CONFIG, release_config_path

if TYPE_CHECKING:
    from dpgrpo.config.json_types import JSONValue

RELEASE_DIR = "release"  # RUN_DIR/release
CERTIFICATE = "certificate.json"
ADAPTER = "adapter_model.safetensors"


def read_json_or_none(path: Path) -> JSONValue:
    """The JSON in ``path``, or None if it is missing or unreadable (an interrupted write)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_release_config(release_dir: str | Path) -> dict[str, object]:
    """The public config of a release (:data:`RELEASE_CONFIG`, or an old ``config.json``)."""
    path = release_config_path(release_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"not a dpgrpo release (no {RELEASE_CONFIG})", path=str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"unreadable release config ({err})", path=str(path)) from None
    if not isinstance(data, dict):
        raise DataError("expected a JSON object", path=str(path))
    return data


@dataclass(frozen=True)
class RunDir:
    """One training run's directory: ``release/`` (public) and ``recovery/`` (private)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def release(self) -> Path:
        return self.root / RELEASE_DIR

    @property
    def recovery(self) -> Path:
        return self.root / "recovery"

    @property
    def certificate_path(self) -> Path:
        return self.release / CERTIFICATE

    @property
    def journal(self) -> Path:
        return self.recovery / "journal.jsonl"

    @property
    def journal_twin(self) -> Path:
        """The journal's second, independent copy (privacy/journal.py): no single lost file
        can lose a charged round."""
        return self.recovery / "journal-twin.jsonl"

    def journals(self) -> tuple[Path, Path]:
        return (self.journal, self.journal_twin)

    def has_charges(self) -> bool:
        """Whether either journal file holds anything (a round may have been charged)."""
        return any(p.exists() and p.stat().st_size > 0 for p in self.journals())

    @property
    def ledger(self) -> Path:
        return self.recovery / "ledger.json"

    @property
    def telemetry(self) -> Path:
        return self.recovery / "telemetry.jsonl"

    @property
    def canaries(self) -> Path:
        return self.recovery / "canaries.json"

    @property
    def config_json(self) -> Path:
        """The full (private) resolved config."""
        return self.recovery / "config.json"

    @property
    def config_toml(self) -> Path:
        return self.recovery / "config.toml"

    @property
    def public_config_path(self) -> Path:
        """``release/dpgrpo_config.json`` (an old release's ``config.json`` when only it exists)."""
        return release_config_path(self.release)

    def public_config(self) -> JSON:
        """The release's public config (DataError when missing or unreadable)."""
        return read_release_config(self.release)

    def certificate(self) -> JSON | None:
        """``release/certificate.json``, or None when it is missing or unreadable."""
        cert = read_json_or_none(self.certificate_path)
        return cert if isinstance(cert, dict) else None

    def release_complete(self, rounds: int) -> bool:
        """Whether ``release/`` holds the adapter and the certificate of all T rounds
        (``rounds``)."""
        cert = self.certificate()
        return (cert is not None and cert.get("rounds_retained") == rounds
                and (self.release / ADAPTER).is_file())


def verify_release_files(release_dir: Path, cert: Mapping[str, object]) -> None:
    """Compare each release file with the sha256 the certificate recorded when it was
    written (``files_sha256``); a mismatch is a ReleaseError naming the file."""
    recorded = cert.get("files_sha256") or {}
    if not isinstance(recorded, dict):
        raise ReleaseError(f"{release_dir / 'certificate.json'} is damaged (files_sha256)")
    for name, digest in sorted(recorded.items()):
        path = release_dir / name
        if not path.is_file() or sha256_file(path) != digest:
            raise ReleaseError(f"{path} does not match the sha256 its certificate recorded: the "
                               "file is damaged; re-create the release with dpgrpo train "
                               "--resume RUN_DIR")


__all__ = ["ADAPTER", "CERTIFICATE", "LEGACY_RELEASE_CONFIG", "RELEASE_CONFIG", "RELEASE_DIR",
           "RunDir", "read_json_or_none", "read_release_config", "release_config_path",
           "verify_release_files"]
