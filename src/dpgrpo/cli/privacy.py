"""`dpgrpo privacy ...`: epsilon, sigma calibration, ledgers and guarantee conversions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dpgrpo.errors import PrivacyBudgetError

if TYPE_CHECKING:
    from dpgrpo.privacy.accounting import PrivacyLedger
    from dpgrpo.privacy.neighbours import NeighbourFigure
    from dpgrpo.privacy.planning import PlanRow
    from dpgrpo.reports.budget import BudgetRow

privacy_app = typer.Typer(help="Privacy accounting: epsilon, sigma calibration, ledgers.",
                          no_args_is_help=True)


def _emit(data: dict, as_json: bool, title: str) -> None:
    """One JSON object, or a table of the values that are set (a None says "not applicable"
    and is left out of the table; --json keeps it)."""
    if as_json:
        typer.echo(json.dumps(data))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    for key, value in data.items():
        if value is None:
            continue
        table.add_row(key, f"{value:.10g}" if isinstance(value, float) else str(value))
    Console().print(table)


def _load_ledgers(paths: list[Path]) -> PrivacyLedger:
    from dpgrpo.privacy.accounting import PrivacyLedger

    ledgers = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            ledgers.append(PrivacyLedger.from_dict(data.get("ledger", data)))  # or a certificate
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise PrivacyBudgetError(f"{path}: not a readable ledger ({err})") from err
    return PrivacyLedger.compose(ledgers)


@privacy_app.command("calibrate")
def calibrate_cmd(
    n: int = typer.Option(..., "--n", help="Number of public slots n."),
    expected_batch: float = typer.Option(
        ..., "--expected-batch", help="Expected prompts per round m (q = m/n)."
    ),
    rounds: int = typer.Option(..., "--rounds", help="Number of rounds T."),
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon."),
    delta: float | None = typer.Option(None, "--delta", help="Target delta (default 1/(10 n))."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The smallest noise multiplier sigma whose PLD epsilon meets the target."""
    from dpgrpo.privacy.calibration import calibrate

    cal = calibrate(n, expected_batch, rounds, epsilon, delta)
    _emit({"sigma": cal.sigma, "epsilon": cal.epsilon, "target_epsilon": cal.target_epsilon,
           "delta": cal.delta, "q": cal.q, "rounds": cal.rounds, "n": cal.n,
           "expected_batch": cal.expected_batch, "rdp_epsilon": cal.rdp_epsilon,
           "rdp_order": cal.rdp_order, "sigma_below": cal.sigma_below,
           "epsilon_below": cal.epsilon_below}, as_json, "sigma calibration (PLD)")


@privacy_app.command("plan")
def plan_cmd(
    n: int = typer.Option(..., "--n", help="Number of public slots n."),
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon."),
    budget: int = typer.Option(..., "--budget", help="Compute budget in completions (m x G x T)."),
    params: int = typer.Option(..., "--params", help="Trainable coordinates p of the adapter "
                               "(a run's certificate states it as trainable_coordinates)."),
    delta: float | None = typer.Option(None, "--delta", help="delta (default 1/(10 n))."),
    batches: str = typer.Option(",".join(map(str, (4, 8, 12, 16, 24, 32, 64, 128))), "--m",
                                help="Candidate expected batches m, comma-separated."),
    groups: str = typer.Option("4,6,8", "--G", help="Candidate group sizes G, comma-separated."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Candidate (m, G, T) for a compute budget: sigma, noise-to-signal sigma sqrt(p)/m and
    the compute of each, from public inputs only (no data is read)."""
    from dpgrpo.errors import ConfigError
    from dpgrpo.privacy.planning import plan_report

    try:
        ms = [float(x) for x in batches.split(",") if x.strip()]
        gs = [int(x) for x in groups.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--m and --G take comma-separated numbers, got {batches!r}, {groups!r}"
        ) from None
    rows = _plan_with_progress(n, epsilon, budget, params, delta, ms, gs)
    report = plan_report(n, epsilon, budget, params, delta, rows)
    best = _recommended(rows)
    report["recommended"] = {"row": best, "rule": RECOMMENDED_RULE}
    if as_json:
        typer.echo(json.dumps(report))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"plan: n {n:,}, epsilon {epsilon:g}, delta {report['delta']:.3g}, "
                        f"p {params:,}, budget {budget:,} completions")
    table.add_column("")
    for column in ("m", "G", "T", "completions", "sigma", "r = sigma sqrt(p)/m",
                   "T min(1, 1/r)"):
        table.add_column(column, justify="right")
    for i, r in enumerate(rows):
        table.add_row("*" if i == best else "", f"{r.m:g}", str(r.G), str(r.T),
                      f"{r.completions:,}", f"{r.sigma:.4f}", f"{r.noise_to_signal:.2f}",
                      f"{_signal_steps(r):.1f}")
    Console().print(table)
    r = rows[best]
    typer.echo(f"rows are sorted by r, the noise-to-signal of one step (then by compute). "
               f"Recommended (*): m {r.m:g}, G {r.G}, T {r.T}, {RECOMMENDED_RULE}")
    if rows[0].T == 1:
        typer.echo("the first row is a single round: the least noise per step, but one "
                   "optimizer step in all.")
    typer.echo("sigma: planning value (slightly above the exact calibration a run performs); "
               "no data was read.")


#: How `privacy plan` picks the row it marks (the module docstring of dpgrpo.privacy.planning:
#: with AdamW, a step whose noise dominates, r > 1, moves about 1/r as far along the signal).
RECOMMENDED_RULE = ("the most signal-sized steps T min(1, 1/r): with AdamW a step moves about "
                    "1/r as far along the signal once noise dominates (r > 1); ties: larger G, "
                    "then lower r. G is yours to weigh: a larger G gives more groups with "
                    "mixed rewards.")


def _signal_steps(row: PlanRow) -> float:
    return row.T * min(1.0, 1.0 / row.noise_to_signal) if row.noise_to_signal > 0 else row.T


def _recommended(rows: list[PlanRow]) -> int:
    """Index of the row with the most signal-sized steps (ties: larger G, then lower r)."""
    return max(range(len(rows)), key=lambda i: (round(_signal_steps(rows[i]), 9), rows[i].G,
                                                -rows[i].noise_to_signal))


def _plan_with_progress(n: int, epsilon: float, budget: int, params: int,
                        delta: float | None, ms: list[float], gs: list[int]) -> list[PlanRow]:
    """:func:`dpgrpo.privacy.planning.plan`, one candidate m at a time with a line on stderr
    for each (each calibrates sigma per T: seconds to minutes); rows sorted as plan sorts them."""
    import time

    from dpgrpo.cli._progress import duration, say
    from dpgrpo.privacy.planning import plan

    fits = [m for m in sorted(set(ms)) if 0 < m <= n and any(budget // (m * g) >= 1 for g in gs)]
    if len(fits) < 2:
        return plan(n, epsilon, budget, params, delta=delta, batches=ms, groups=gs)
    rows = []
    start = time.monotonic()
    for i, m in enumerate(fits, 1):
        found = plan(n, epsilon, budget, params, delta=delta, batches=[m], groups=gs)
        rows += found
        say(f"plan: m {m:g} ({i}/{len(fits)}): T {', '.join(str(r.T) for r in found)}, sigma "
            f"{', '.join(f'{r.sigma:.3f}' for r in found)} ({duration(time.monotonic() - start)}"
            " so far)")
    return sorted(rows, key=lambda r: (r.noise_to_signal, -r.completions))  # as plan() sorts


@privacy_app.command("epsilon")
def epsilon_cmd(
    n: int = typer.Option(..., "--n", help="Number of public slots n."),
    expected_batch: float = typer.Option(
        ..., "--expected-batch", help="Expected prompts per round m."
    ),
    rounds: int = typer.Option(..., "--rounds", help="Number of rounds T."),
    sigma: float = typer.Option(..., "--sigma", help="Noise multiplier sigma (> 0)."),
    delta: float | None = typer.Option(None, "--delta", help="delta (default 1/(10 n))."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Epsilon of T Poisson-subsampled Gaussian rounds (PLD, with RDP beside it)."""
    from dpgrpo.privacy.accounting import epsilon_report
    from dpgrpo.privacy.limits import check_accountable_sigma

    check_accountable_sigma(sigma, "--sigma")  # before the accountant tries (GiB, minutes)
    _emit(epsilon_report(n, expected_batch, rounds, sigma, delta).to_dict(), as_json, "epsilon")


@privacy_app.command("ledger")
def ledger_cmd(
    paths: list[Path] = typer.Argument(..., help="ledger.json or certificate.json files "
                                                 "(several: composed)."),
    delta: float = typer.Option(..., "--delta", help="delta at which to report epsilon."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Recompute epsilon from one or more saved ledgers (several runs on the same data compose)."""
    ledger = _load_ledgers(paths)
    rdp, order = ledger.rdp_epsilon(delta)
    _emit({"epsilon": ledger.epsilon(delta), "delta": delta, "rounds": ledger.rounds,
           "rdp_epsilon": rdp, "rdp_order": order, "runs": len(paths)}, as_json, "ledger")


@privacy_app.command("convert")
def convert_cmd(
    ledgers: list[Path] = typer.Option(
        [],
        "--ledger",
        help="ledger.json or certificate.json of a "
        "run (repeatable: runs on the same data compose).",
    ),
    n: int | None = typer.Option(
        None, "--n", help="Number of public slots n (with --expected-batch, --rounds, --sigma)."
    ),
    expected_batch: float | None = typer.Option(
        None, "--expected-batch", help="Expected prompts per round m."
    ),
    rounds: int | None = typer.Option(None, "--rounds", help="Number of rounds T."),
    sigma: float | None = typer.Option(None, "--sigma", help="Noise multiplier sigma (> 0)."),
    epsilon: float | None = typer.Option(
        None,
        "--epsilon",
        help="Only an add-or-remove-one (epsilon, delta) is known: generic conversion.",
    ),
    delta: float | None = typer.Option(
        None, "--delta", help="delta (default 1/(10 n) with --n; required otherwise)."
    ),
    group: int = typer.Option(
        1, "--group", help="Prompts of one person, added/removed or swapped together (k)."
    ),
    relation: str = typer.Option(
        "add-or-remove-one",
        "--relation",
        help="add-or-remove-one or replace-one (one prompt swapped).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Guarantee for one prompt swapped (replace-one) or a person's k prompts, at the same delta.

    A ledger or (n, m, T, sigma) is accounted directly (PLD accountant).

    --epsilon/--delta alone: generic conversion (Proposition 1, Corollary 1).
    """
    mechanism = (n, expected_batch, rounds, sigma)
    if sum([bool(ledgers), any(v is not None for v in mechanism), epsilon is not None]) != 1:
        raise PrivacyBudgetError("give exactly one of --ledger, --n/--expected-batch/--rounds/"
                                 "--sigma, or --epsilon with --delta")
    if (epsilon is not None or ledgers) and delta is None:
        raise PrivacyBudgetError("--epsilon and --ledger need --delta (a ledger does not record n)")
    from dpgrpo.privacy.accounting import RoundEvent, default_delta, sampling_rate
    from dpgrpo.privacy.neighbours import converted_figure, neighbour_figure

    if epsilon is not None and delta is not None:
        figure = converted_figure(epsilon, delta, relation, group)
    elif ledgers and delta is not None:
        figure = neighbour_figure(_load_ledgers(ledgers).events, delta, relation, group)
    elif n is not None and expected_batch is not None and rounds is not None and sigma is not None:
        if rounds < 1 or not sigma > 0:
            raise PrivacyBudgetError(f"need --rounds >= 1 and --sigma > 0, got {rounds}, {sigma}")
        from dpgrpo.privacy.limits import check_accountable_sigma

        check_accountable_sigma(sigma, "--sigma")
        events = [RoundEvent(sampling_rate(n, expected_batch), sigma, rounds)]
        delta = default_delta(n) if delta is None else delta
        figure = neighbour_figure(events, delta, relation, group)
    else:
        raise PrivacyBudgetError("--n, --expected-batch, --rounds and --sigma go together")
    _emit(figure.to_dict(), as_json, "guarantee")
    if not as_json:
        typer.echo(_convert_sentence(figure, from_epsilon=epsilon is not None))


def _convert_sentence(figure: NeighbourFigure, *, from_epsilon: bool) -> str:
    """What the figure means, in a sentence; above all when it is vacuous."""
    who = ("one prompt swapped" if figure.relation == "replace-one" and figure.group == 1 else
           f"a group of {figure.group} prompts" + (" swapped" if figure.relation == "replace-one"
                                                   else " added or removed together"))
    if figure.meaningful:
        return (f"for {who}: ({figure.epsilon:.4g}, {figure.delta:.3g})-DP "
                f"({figure.method}: {figure.basis}).")
    why = (f"delta = {figure.delta:.4g} is at least 1, and a delta of 1 or more holds for any "
           "mechanism" if figure.delta >= 1 else "epsilon is infinite")
    hint = (" The generic conversion from (epsilon, delta) alone is loose: --ledger, or "
            "--n/--expected-batch/--rounds/--sigma, accounts the mechanism itself and is often "
            "far tighter." if from_epsilon else "")
    return (f"VACUOUS: this figure is no guarantee for {who}: {why}, so it bounds nothing "
            f"(meaningful False).{hint}")


@privacy_app.command("report")
def report_cmd(
    configs: list[Path] = typer.Argument(..., help="Training configs (TOML, as `dpgrpo train` "
                                                   "takes them)."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Markdown file for the Table VI-style table."),
    overrides: list[str] = typer.Option([], "--set", help="Override applied to every config: "
                                                          "section.key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"rows\": [...]} as one JSON "
                                                       "object and also write the rows beside "
                                                       "OUT with the suffix .json."),
) -> None:
    """Budget table (n, m, sigma, T, PLD and RDP epsilon) of training configs (Appendix A-F)."""
    from dpgrpo.reports.budget import budget_table, write_budget_report

    rows = _budget_rows_with_progress(configs, overrides)
    written = write_budget_report(rows, out, as_json=as_json)
    typer.echo(json.dumps({"rows": [r.to_dict() for r in rows]}) if as_json
               else budget_table(rows))
    for path in written:
        typer.echo(f"wrote {path}", err=True)


def _budget_rows_with_progress(configs: list[Path], overrides: list[str]) -> list[BudgetRow]:
    """:func:`dpgrpo.reports.budget.budget_rows`, with a line on stderr before and after each
    config (calibrating sigma takes seconds to minutes each); public figures only."""
    import time

    from dpgrpo.cli._progress import duration, say
    from dpgrpo.config import load_protocol_config
    from dpgrpo.reports.budget import resolve_budget

    cache: dict = {}  # shared calibrations, as budget_rows shares them
    rows = []
    for i, path in enumerate(configs, 1):
        start = time.monotonic()
        say(f"report: {path} ({i}/{len(configs)}): counting slots, calibrating sigma ...")
        config, _ = load_protocol_config(Path(path), list(overrides))
        row = resolve_budget(config, Path(path).stem, cache=cache)
        rows.append(row)
        say(f"report: {row.configuration}: n {row.n:,}, m {row.m:g}, T {row.T}, sigma "
            f"{row.sigma:.4f}, epsilon {row.pld_epsilon:.4g} (PLD) at delta {row.delta:.3g} "
            f"[{duration(time.monotonic() - start)}]")
    return rows


def register(app: typer.Typer) -> None:
    """Add `dpgrpo privacy` to the app."""
    app.add_typer(privacy_app, name="privacy")
