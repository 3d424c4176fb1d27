"""`dpgrpo data ...`: inspect the benchmark splits the loaders build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import typer

data_app = typer.Typer(help="Benchmark data: split sizes and validation.", no_args_is_help=True)


@data_app.command("summary")
def summary_cmd(
    task: str = typer.Option(..., "--task", help="arithmetic, gsm8k, math, csqa or svamp."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Folder holding the benchmark files (e.g. ../shared/data)."),
    skip_invalid: bool = typer.Option(
        False, "--skip-invalid", help="Skip invalid records and list them (default: fail)."),
    source: str = typer.Option("local", "--source", help="local (files) or hub (datasets)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Size of every split (train, eval; MATH's exclusions). Exit status 1 if a split failed."""
    from dpgrpo.tasks import split_summary

    summary = split_summary(task, data_dir, skip_invalid=skip_invalid, source=source)
    errors = cast(dict[str, str], summary.get("errors", {}))    # split -> message
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_table(task, summary)
    for split, message in errors.items():
        hint = " (--skip-invalid skips and lists invalid records)" if ", line " in message else ""
        typer.secho(f"error: {split}: {message}{hint}", err=True, fg="red")
    if errors:
        raise typer.Exit(1)


def _print_table(task: str, summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{task} splits", show_header=False)
    errors = summary.get("errors", {})
    for key, value in summary.items():
        if key in ("skipped", "errors"):
            continue
        shown = (
            "error (below)" if key in errors else "not available" if value is None else f"{value:,}"
        )
        table.add_row(key, shown)
    console = Console()
    console.print(table)
    for line in summary.get("skipped", []):
        console.print(f"skipped: {line}", markup=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.add_typer(data_app, name="data")
