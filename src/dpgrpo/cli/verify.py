"""`dpgrpo verify`: run the mechanism-verification checks and write their record."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def verify_cmd(
    group: str = typer.Option("all", "--group", help="mechanism, model or all."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                       help="Write the machine-readable record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the record as one JSON object."),
) -> None:
    """Run the mechanism-verification checks (Appendix B); exit non-zero if any fails."""
    from dpgrpo import __version__
    from dpgrpo.verify import run_checks

    groups = ("mechanism", "model") if group == "all" else (group,)
    results = run_checks(groups)
    record = {"dpgrpo_version": __version__, "checks": [r.to_dict() for r in results],
              "passed": bool(results) and all(r.passed for r in results)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2))
    if as_json:
        typer.echo(json.dumps(record))
    else:
        _print_table(results)
    if not record["passed"]:
        raise typer.Exit(1)


def _print_table(results: list) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dpgrpo verify")
    for col in ("check", "group", "measured", "tolerance", "passed"):
        table.add_column(col)
    for r in results:
        table.add_row(r.check, r.group, f"{r.measured:.3g}", f"{r.comparison} {r.tolerance:.3g}",
                      "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add `dpgrpo verify` to the app."""
    app.command("verify")(verify_cmd)
