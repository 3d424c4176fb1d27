"""The layout of a run directory, in one place (light: no torch at import).

::

    RUN_DIR/release/    what may be published (release.RELEASE_FILES): adapter, public config,
                        certificate.json, model card
    RUN_DIR/recovery/   private: config.json/.toml (full), journal.jsonl and its twin
                        journal-twin.jsonl, ledger.json, telemetry.jsonl, canaries.json, step-XXXXXX/ checkpoints
    RUN_DIR/.lock       the writer's pid (runlock.py)

:class:`RunDir` names these paths and reads what others read from a run: the public config,
the certificate and whether the release is complete. Writers (checkpoint.py, the trainer,
privacy/journal.py) take their paths from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpgrpo.release.files import RELEASE_DIR, read_release_config, release_config_path

CERTIFICATE = "certificate.json"
ADAPTER = "adapter_model.safetensors"


def read_json_or_none(path: Path) -> Any:
    """The JSON in ``path``, or None if it is missing or unreadable (an interrupted write)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


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

    def public_config(self) -> dict[str, Any]:
        """The release's public config (DataError when missing or unreadable)."""
        return read_release_config(self.release)

    def certificate(self) -> dict[str, Any] | None:
        """``release/certificate.json``, or None when it is missing or unreadable."""
        cert = read_json_or_none(self.certificate_path)
        return cert if isinstance(cert, dict) else None

    def release_complete(self, rounds: int) -> bool:
        """Whether ``release/`` holds the adapter and the certificate of all T rounds (``rounds``)."""
        cert = self.certificate()
        return (cert is not None and cert.get("rounds_retained") == rounds
                and (self.release / ADAPTER).is_file())


__all__ = ["ADAPTER", "CERTIFICATE", "RunDir", "read_json_or_none"]
