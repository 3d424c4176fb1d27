"""`dpgrpo privacy ...`: epsilon, sigma calibration, ledgers and guarantee conversions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from dpgrpo.errors import PrivacyBudgetError

privacy_app = typer.Typer(help="Privacy accounting: epsilon, sigma calibration, ledgers.",
                          no_args_is_help=True)


def _emit(data: dict, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(data))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    for key, value in data.items():
        table.add_row(key, f"{value:.10g}" if isinstance(value, float) else str(value))
    Console().print(table)


@privacy_app.command("calibrate")
def calibrate_cmd(
    n: int = typer.Option(..., "--n", help="Number of public slots n."),
    expected_batch: float = typer.Option(..., "--expected-batch", help="Expected prompts per round m (q = m/n)."),
    steps: int = typer.Option(..., "--steps", help="Number of rounds T."),
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon."),
    delta: Optional[float] = typer.Option(None, "--delta", help="Target delta (default 1/(10 n))."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The smallest noise multiplier sigma whose PLD epsilon meets the target."""
    from dpgrpo.privacy.accounting import calibrate

    cal = calibrate(n, expected_batch, steps, epsilon, delta)
    _emit({"sigma": cal.sigma, "epsilon": cal.epsilon, "target_epsilon": cal.target_epsilon,
           "delta": cal.delta, "q": cal.q, "steps": cal.steps, "n": cal.n,
           "expected_batch": cal.expected_batch, "rdp_epsilon": cal.rdp_epsilon,
           "rdp_order": cal.rdp_order, "sigma_below": cal.sigma_below,
           "epsilon_below": cal.epsilon_below}, as_json, "sigma calibration (PLD)")


@privacy_app.command("epsilon")
def epsilon_cmd(
    n: int = typer.Option(..., "--n", help="Number of public slots n."),
    expected_batch: float = typer.Option(..., "--expected-batch", help="Expected prompts per round m."),
    steps: int = typer.Option(..., "--steps", help="Number of rounds T."),
    sigma: float = typer.Option(..., "--sigma", help="Noise multiplier sigma (> 0)."),
    delta: Optional[float] = typer.Option(None, "--delta", help="delta (default 1/(10 n))."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Epsilon of T Poisson-subsampled Gaussian rounds (PLD, with RDP beside it)."""
    from dpgrpo.privacy.accounting import compute_epsilon

    _emit(compute_epsilon(n, expected_batch, steps, sigma, delta).to_dict(), as_json, "epsilon")


@privacy_app.command("ledger")
def ledger_cmd(
    paths: list[Path] = typer.Argument(..., help="ledger.json files (several: composed)."),
    delta: float = typer.Option(..., "--delta", help="delta at which to report epsilon."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Recompute epsilon from one or more saved ledgers (several runs on the same data compose)."""
    from dpgrpo.privacy.accounting import PrivacyLedger

    ledgers = []
    for path in paths:
        try:
            ledgers.append(PrivacyLedger.load(path))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise PrivacyBudgetError(f"{path}: not a readable ledger ({err})") from err
    ledger = PrivacyLedger.compose(ledgers)
    rdp, order = ledger.rdp_epsilon(delta)
    _emit({"epsilon": ledger.epsilon(delta), "delta": delta, "rounds": ledger.rounds,
           "rdp_epsilon": rdp, "rdp_order": order, "runs": len(ledgers)}, as_json, "ledger")


@privacy_app.command("convert")
def convert_cmd(
    epsilon: float = typer.Option(..., "--epsilon"),
    delta: float = typer.Option(..., "--delta"),
    group: int = typer.Option(1, "--group", help="Prompts contributed by one person (group privacy)."),
    replace_one: bool = typer.Option(False, "--replace-one", help="Replace-one neighbours."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Convert an add/remove prompt-level guarantee to replace-one or person-level terms."""
    from dpgrpo.privacy import accounting

    eps, dlt = accounting.group_privacy(epsilon, delta, group)
    if replace_one:
        eps, dlt = accounting.replace_one(eps, dlt)
    _emit({"epsilon": eps, "delta": dlt, "group": group, "replace_one": replace_one,
           "meaningful": bool(math.isfinite(eps) and dlt < 1)}, as_json, "converted guarantee")


@privacy_app.command("report")
def report_cmd(
    configs: list[Path] = typer.Argument(..., help="Training configs (TOML, as `dpgrpo train` "
                                                   "takes them)."),
    out: Path = typer.Option(..., "--out", help="Markdown file for the Table VI-style table."),
    overrides: list[str] = typer.Option([], "--set", help="Override applied to every config: "
                                                          "section.key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON and also write "
                                                       "them beside OUT with the suffix .json."),
) -> None:
    """Budget table (n, m, sigma, T, PLD and RDP epsilon) of training configs (Appendix A-F)."""
    from dpgrpo.reports.budget import budget_rows, budget_table, write_budget_report

    rows = budget_rows(configs, overrides)
    written = write_budget_report(rows, out, as_json=as_json)
    typer.echo(json.dumps([r.to_dict() for r in rows]) if as_json else budget_table(rows))
    for path in written:
        typer.echo(f"wrote {path}", err=True)


def register(app: typer.Typer) -> None:
    """Add `dpgrpo privacy` to the app."""
    app.add_typer(privacy_app, name="privacy")
