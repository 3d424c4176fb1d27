"""`dpgrpo tune`: choose settings on a public proxy task at the private run's budget."""

from __future__ import annotations

from pathlib import Path

import typer


def tune_cmd(
    config: Path = typer.Argument(..., help="The private run's TOML config (an optional "
                                            "\\[tune] table: proxy, proxy_data_dir, workers, "
                                            "seeds, eval_limit and \\[tune.grid])."),
    proxy: str | None = typer.Option(None, "--proxy", help="Public proxy task (e.g. "
                                        "arithmetic-2); default: tune.proxy."),
    proxy_data_dir: str | None = typer.Option(None, "--proxy-data-dir",
                                                 help="Data folder of the proxy task."),
    out: Path = typer.Option(Path("runs/tune"), "--out", "-o", help="Work folder; resumable."),
    workers: int | None = typer.Option(None, "--workers", min=1,
                                          help="Processes training points at once."),
    eval_limit: int | None = typer.Option(None, "--eval-limit", min=1,
                                             help="Score on the first N proxy eval problems."),
    seeds: int | None = typer.Option(None, "--seeds", min=1,
                                        help="Runs per point, scored by their mean accuracy "
                                             "(default: tune.seeds, else 1)."),
    overrides: list[str] = typer.Option([], "--set", help="section.key=value (repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress messages."),
) -> None:
    """Train every grid point on the proxy with the private run's epsilon, n and T; write the
    grid's table and the chosen config. Privacy cost: zero (the private data is never read)."""
    from dpgrpo.experiments.tune import grid_table, load_tune

    cfg, settings = load_tune(config, overrides, proxy=proxy, proxy_data_dir=proxy_data_dir,
                              workers=workers, eval_limit=eval_limit, seeds=seeds)
    from dpgrpo.experiments.tune import run_tune

    say = (lambda m: None) if quiet else (lambda m: typer.echo(m, err=True))
    result = run_tune(cfg, settings, out, progress=say)
    typer.echo(grid_table(result))
    typer.echo(f"chosen: {result.chosen}; wrote {result.chosen_config} and "
               f"{result.out_dir / 'tune.json'}")
    typer.echo("privacy cost: zero (trained and scored on the public proxy only; the private "
               "data was never opened)")


def register(app: typer.Typer) -> None:
    """Add `dpgrpo tune` to the app."""
    app.command("tune")(tune_cmd)
