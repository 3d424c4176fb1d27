"""`dpgrpo release check`: check a release against its certificate (files, tensors, epsilon)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

release_app = typer.Typer(help="Releases: check one against its certificate.",
                          no_args_is_help=True)


@release_app.command("check")
def check_cmd(
    run: Path = typer.Argument(..., help="Run directory (its release/ is checked) or a "
                                         "release directory."),
    skip_epsilon: bool = typer.Option(False, "--skip-epsilon",
                                      help="Only the files and tensors (no accountant)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Check every file against the certificate's sha256, every tensor for NaN/inf, and
    recompute epsilon from the certificate's public figures; print the guarantee. Exit
    status 1 on any mismatch. (`dpgrpo verify` checks the mechanism's code, not a release.)"""
    from dpgrpo.release.check import check_release

    result = check_release(run, epsilon=not skip_epsilon)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        for c in result.checks:
            mark = {True: "ok  ", False: "FAIL", None: "n/a "}[c.passed]
            typer.echo(f"{mark} {c.name}: {c.detail}")
        if result.ok:
            typer.echo(result.guarantee)
        else:
            typer.secho(f"release check FAILED: {result.release_dir} does not match its "
                        "certificate (" + ", ".join(c.name for c in result.failures) + ")",
                        err=True, fg="red")
    if not result.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `dpgrpo release ...` to the app."""
    app.add_typer(release_app, name="release")
