"""`dpgrpo protocol`: the fixed protocol of Section VII-C on one benchmark (train, eval, compare).

A thin wrapper over :mod:`dpgrpo.experiments.protocol`; options given here override the config's
optional ``[protocol]`` table, which overrides the defaults in code.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def protocol_cmd(
    config: Path | None = typer.Argument(
        None, help="Benchmark TOML (as `dpgrpo train` takes it, plus an optional \\[protocol] "
                   "table); default: the embedded CPU demo."),
    seeds: int | None = typer.Option(None, "--seeds", help="Seeds per private arm (default 2)."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                       help="Output folder (default runs/protocol-<task>)."),
    arms: list[str] | None = typer.Option(
        None, "--arms", help="Trained arms, comma-separated or repeated (default: dp-grpo, "
                             "zero-advantage, filtered-sft, gold-sft)."),
    ladder: bool | None = typer.Option(None, "--ladder/--no-ladder",
                                          help="Add shuffled-reward and positive-only."),
    non_private: bool | None = typer.Option(None, "--non-private/--no-non-private",
                                               help="Add non-private GRPO (one run unless "
                                                    "--non-private-seeds)."),
    non_private_seeds: int | None = typer.Option(
        None, "--non-private-seeds", min=1, help="Runs of the non-private arm (default 1)."),
    eval_limit: int | None = typer.Option(None, "--eval-limit",
                                             help="Evaluate the first N problems only."),
    eval_batch_size: int | None = typer.Option(None, "--eval-batch-size",
                                                  help="Prompts per generate call in eval."),
    draws: int | None = typer.Option(None, "--draws", help="Bootstrap draws of compare."),
    sign_draws: int | None = typer.Option(None, "--sign-draws",
                                             help="Sign-randomization draws of compare."),
    figures: bool | None = typer.Option(None, "--figures/--no-figures",
                                           help="Write PNG figures (needs matplotlib)."),
    overrides: list[str] = typer.Option([], "--set",
                                        help="Override: section.key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Train every arm per seed, evaluate each the same way, compare with the base; resumable."""
    from dpgrpo.config import load_protocol_config
    from dpgrpo.experiments.protocol import plan_protocol, protocol_settings, run_protocol

    cfg, table = load_protocol_config(config, overrides)
    arm_list = [a.strip() for value in arms or [] for a in value.split(",") if a.strip()]
    settings = protocol_settings(
        table, seeds=seeds, arms=arm_list or None, ladder=ladder, non_private=non_private,
        non_private_seeds=non_private_seeds,
        eval_limit=eval_limit, eval_batch_size=eval_batch_size, draws=draws,
        sign_draws=sign_draws, figures=figures)
    plan = plan_protocol(cfg, settings, out or Path("runs") / f"protocol-{cfg.data.task}")
    b = plan.budget
    typer.echo(f"{plan.out_dir}: {len(plan.runs)} runs; n={b.n}, m={b.m:g}, sigma={b.sigma:.6g}, "
               f"T={b.T}, epsilon={b.pld_epsilon:.4g} at delta={b.delta:.3g}", err=True)
    result = run_protocol(plan, progress=lambda message: typer.echo(message, err=True))
    if as_json:
        typer.echo(json.dumps({
            "out": str(plan.out_dir), "epsilon": result.epsilon,
            "accuracy": {name: s["accuracy"] for name, s in result.summaries.items()},
            "n": {name: s["n"] for name, s in result.summaries.items()},
            "report": [str(p) for p in result.report]}))
        return
    for name, summary in result.summaries.items():
        strict = summary["accuracy"].get("strict")
        typer.echo(f"{name}: strict accuracy {strict:.4f} (n={summary['n']})")
    typer.echo(f"epsilon (largest private run): {result.epsilon:.4g}")
    for path in result.report:
        typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add `dpgrpo protocol` to the app."""
    app.command("protocol")(protocol_cmd)
