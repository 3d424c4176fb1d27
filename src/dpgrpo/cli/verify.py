"""`dpgrpo verify`: run the mechanism-verification checks and write their record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def verify_cmd(
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the machine-readable record here."),
    group: str = typer.Option("all", "--group", help="mechanism, model or all."),
) -> None:
    """Run the mechanism-verification checks (Appendix B); exit non-zero if any fails."""
    from rich.console import Console
    from rich.table import Table

    from dpgrpo import __version__
    from dpgrpo.verify import run_checks

    groups = ("mechanism", "model") if group == "all" else (group,)
    results = run_checks(groups)
    table = Table(title="dpgrpo verify")
    for col in ("check", "group", "measured", "tolerance", "passed"):
        table.add_column(col)
    for r in results:
        table.add_row(r.check, r.group, f"{r.measured:.3g}", f"{r.comparison} {r.tolerance:.3g}",
                      "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
    Console().print(table)
    if json_path is not None:
        record = {"dpgrpo_version": __version__, "checks": [r.to_dict() for r in results],
                  "passed": all(r.passed for r in results)}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(record, indent=2))
    if not results or not all(r.passed for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `dpgrpo verify` to the app."""
    app.command("verify")(verify_cmd)
