"""`dpgrpo push`: upload a run's release/ (never recovery/) to the Hugging Face hub."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def push_cmd(
    run: Path = typer.Argument(..., help="Run directory (its release/ is uploaded) or a "
                                         "release directory."),
    repo_id: str = typer.Option(..., "--repo-id", help="Hub model repository, e.g. user/name."),
    private: bool = typer.Option(False, "--private", help="Create the repository private."),
    revision: str | None = typer.Option(None, "--revision", help="Branch to commit to."),
    force: bool = typer.Option(False, "--force", help="Publish even if the certificate says "
                                                      "NOT releasable (seeded or non-private)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Upload release/ (adapter, model card, certificate, public config) with huggingface_hub.

    Refuses recovery/ (hidden randomness and private training data), a folder holding anything
    but release files, and a release whose certificate says not releasable unless --force.
    """
    from dpgrpo.errors import DPGRPOError
    from dpgrpo.release.publish import push_release

    try:
        url = push_release(run, repo_id, private=private, force=force, revision=revision)
    except DPGRPOError:
        raise                              # one line from dpgrpo.cli.main
    except Exception as err:  # only the hub's and the network's, re-raised else
        message = hub_error_message(err, repo_id)
        if message is None:
            raise
        typer.secho(f"error: {message}", err=True, fg="red")
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"repo_id": repo_id, "commit_url": url}) if as_json else f"pushed {url}")


#: Modules whose exceptions mean "the hub or the network failed" (httpx2 is the hub library's
#: own client in huggingface_hub 2.x; requests and urllib3 in older ones).
_NETWORK_MODULES = ("httpx", "httpcore", "requests", "urllib3", "huggingface_hub", "aiohttp")


def hub_error_message(err: BaseException, repo_id: str) -> str | None:
    """One line naming the cause of a failed upload, or None when ``err`` is not a hub or
    network error (a bug: let its traceback show)."""
    import errno

    def from_network(cls: type) -> bool:
        return any(c.__module__.split(".")[0].startswith(_NETWORK_MODULES) for c in cls.__mro__)

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return None                        # dpgrpo.cli.main names the disk
    if not (from_network(type(err)) or isinstance(err, OSError)):
        return None
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    cause = f"{type(err).__name__}: {text}" if text else type(err).__name__
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(status, int):
        hint = ("log in (hf auth login) or set HF_TOKEN, with write access to the repository"
                if status in (401, 403) else "see the hub's message")
        return (f"the Hugging Face hub refused the push to {repo_id} (HTTP {status}): "
                f"{cause[:300]}; {hint}; the release was not published")
    import socket

    local = (isinstance(err, OSError) and not from_network(type(err))
             and not isinstance(err, (ConnectionError, TimeoutError, socket.gaierror,
                                      socket.herror)))
    if local:                              # a file of the release, not the network
        return f"cannot push {repo_id}: {cause[:300]}; the release was not published"
    if "token" in type(err).__name__.lower():
        return (f"no Hugging Face token ({cause[:300]}): log in (hf auth login) or set HF_TOKEN; "
                "the release was not published")
    return (
        f"cannot reach the Hugging Face hub to push {repo_id} ({cause[:300]}): check the "
        "network connection (and HF_ENDPOINT or a proxy, if set); the release was not published"
    )


def register(app: typer.Typer) -> None:
    """Add `dpgrpo push` to the app."""
    app.command("push")(push_cmd)
