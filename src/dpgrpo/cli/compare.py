"""``dpgrpo compare``: accuracy, paired contrasts and figures from evaluation outputs.

A thin wrapper over :func:`dpgrpo.reports.compare.run_compare` (paper Sections VII-E, VIII).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dpgrpo.evaluation import defaults as stats  # constants only: scipy loads on use


def _split_labels(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def compare(
    inputs: list[Path] = typer.Argument(
        ..., help="predictions.jsonl files, eval output dirs, or run dirs with eval/."),
    base: Path = typer.Option(..., "--base", help="The public base's predictions (file or dir)."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Output directory for report.md, report.json and figures."),
    as_json: bool = typer.Option(False, "--json", help="Print report.json's object on stdout."),
    labels: list[str] | None = typer.Option(
        None, "--labels",
        help="ARM or ARM:SEED per input (comma-separated or repeated), used where an input "
             "has no summary.json arm/seed."),
    draws: int = typer.Option(stats.DEFAULT_BOOTSTRAP_DRAWS, "--draws",
                              help="Problem-cluster bootstrap draws."),
    sign_draws: int = typer.Option(stats.DEFAULT_SIGN_DRAWS, "--sign-draws",
                                   help="Sign-randomization draws."),
    seed: int = typer.Option(stats.DEFAULT_SEED, "--seed",
                             help="Seed of the bootstrap and the sign randomization (recorded)."),
    holm_family: str = typer.Option(
        "contrast", "--holm-family",
        help="Holm family: 'contrast' (its seed pairs) or 'report' (all contrasts)."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write PNG figures."),
) -> None:
    """Compare evaluated arms with the base: accuracies, intervals, tests, MDEs, figures."""
    from dpgrpo.reports.compare import Settings, run_compare

    settings = Settings(draws=draws, sign_draws=sign_draws, seed=seed,
                        holm_family=holm_family)  # type: ignore[arg-type]
    comparison, written = run_compare(inputs, base, out, labels=_split_labels(labels),
                                      settings=settings, write_json=True, figures=figures)
    if as_json:
        typer.echo(json.dumps(comparison.to_dict()))
        for path in written:
            typer.echo(f"wrote {path}", err=True)
        return
    for row in comparison.contrasts:
        if row.scorer == comparison.scorers[0]:
            c = row.result
            typer.echo(f"{row.arm} - {row.comparator} ({row.scorer}): {c.difference:+.2f} pp "
                       f"[{c.ci[0]:.2f}, {c.ci[1]:.2f}]")
    for path in written:
        typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to the app."""
    app.command("compare")(compare)
