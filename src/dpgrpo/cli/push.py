"""`dpgrpo push`: upload a run's release/ (never recovery/) to the Hugging Face hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def push_cmd(
    run: Path = typer.Argument(..., help="Run directory (its release/ is uploaded) or a "
                                         "release directory."),
    repo_id: str = typer.Option(..., "--repo-id", help="Hub model repository, e.g. user/name."),
    private: bool = typer.Option(False, "--private", help="Create the repository private."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to commit to."),
    force: bool = typer.Option(False, "--force", help="Publish even if the certificate says "
                                                      "NOT releasable (seeded or non-private)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Upload release/ (adapter, model card, certificate, public config) with huggingface_hub.

    Refuses recovery/ (hidden randomness and private training data), a folder holding anything
    but release files, and a release whose certificate says not releasable unless --force.
    """
    from dpgrpo.release.publish import push_release

    url = push_release(run, repo_id, private=private, force=force, revision=revision)
    typer.echo(json.dumps({"repo_id": repo_id, "commit_url": url}) if as_json else f"pushed {url}")


def register(app: typer.Typer) -> None:
    """Add `dpgrpo push` to the app."""
    app.command("push")(push_cmd)
