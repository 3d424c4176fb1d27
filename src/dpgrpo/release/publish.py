"""Publishing a release: :func:`push_release` uploads release/ (never recovery/) to the
Hugging Face hub, after :func:`check_publishable` has verified it is a complete, untampered
release (:func:`dpgrpo.release.check.check_release`: files against the certificate's sha256,
finite tensors) whose certificate says releasable (light: no torch at import)."""

from __future__ import annotations

from pathlib import Path

from dpgrpo.errors import ConfigError, ReleaseError
from dpgrpo.release.check import check_release
from dpgrpo.release.files import RELEASE_FILES, release_dir_of


def check_publishable(release_dir: Path, *, force: bool = False) -> dict[str, object]:
    """The certificate of a release that may be published; refuses recovery/ and anything that
    is not a complete release, and a certificate that says not releasable unless ``force``."""
    if release_dir.name == "recovery" or any(
            (release_dir / name).exists() for name in ("journal.jsonl", "journal-twin.jsonl")):
        raise ReleaseError(f"{release_dir} is a recovery folder: it holds the hidden randomness "
                           "and private training data; only release/ may be published")
    stray = sorted(p.name for p in release_dir.iterdir() if p.name not in RELEASE_FILES)
    if stray:
        raise ReleaseError(f"{release_dir} holds files a release may not hold: {stray}")
    for name in ("adapter_model.safetensors", "adapter_config.json", "certificate.json"):
        if not (release_dir / name).is_file():
            raise ReleaseError(f"{release_dir} is not a complete release (no {name})")
    # every file against the certificate's sha256, every tensor finite: never with --force
    checked = check_release(release_dir, epsilon=False)
    checked.raise_for_failure()
    cert = checked.certificate
    if not cert.get("releasable") and not force:
        raise ReleaseError(f"{release_dir}: the certificate says NOT releasable "
                           f"({cert.get('not_releasable_because', 'no reason given')}); "
                           "pass --force to publish it anyway")
    return cert


def push_release(path: str | Path, repo_id: str, *, private: bool = False, force: bool = False,
                 revision: str | None = None, token: str | None = None,
                 message: str | None = None) -> str:
    """Upload a run's release/ (only the allow-listed release files) to the hub model repo
    ``repo_id`` with huggingface_hub; return the commit URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ConfigError("dpgrpo push needs huggingface_hub: "
                          "pip install huggingface_hub") from None
    release = release_dir_of(path)
    if not release.is_dir():
        raise ConfigError(f"{release} is not a directory")
    cert = check_publishable(release, force=force)
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    eps = cert.get("epsilon")
    commit = api.upload_folder(
        folder_path=str(release), repo_id=repo_id, repo_type="model", revision=revision,
        allow_patterns=sorted(RELEASE_FILES),
        commit_message=message or f"dpgrpo release (epsilon={eps}, delta={cert.get('delta')})")
    return str(getattr(commit, "commit_url", commit))


__all__ = ["check_publishable", "push_release"]
