"""`dpgrpo study`: the CPU-scale learning and audit study in one command
(dpgrpo.experiments.study)."""

from __future__ import annotations

from pathlib import Path

import typer


def study_cmd(
    config: Path = typer.Argument(
        Path("configs/cpu-study.toml"),
        help="Study TOML: a run config with \\[protocol] and \\[study] tables.",
    ),
    out: Path = typer.Option(
        Path("runs/cpu-study"),
        "--out",
        "-o",
        help="Work folder (runs, evaluations, audits); resumable.",
    ),
    results: Path = typer.Option(
        Path("docs/results"), "--results", help="Where cpu-study.md, cpu-study.json and figures go."
    ),
    sweep: bool = typer.Option(
        False, "--sweep/--no-sweep", help="Also train DP-GRPO at the epsilons of study.sweep."
    ),
    dp_leaky: bool | None = typer.Option(
        None,
        "--dp-leaky/--no-dp-leaky",
        help="Also audit the leaky recipe made private (default: study.dp_leaky).",
    ),
    seeds: int | None = typer.Option(
        None,
        "--seeds",
        min=1,
        help="Runs of each trained arm, private and "
        "non-private (default: protocol.seeds and "
        "protocol.non_private_seeds).",
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Processes running independent tasks at once (default: study.workers).",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress messages."),
) -> None:
    """Base, non-private GRPO, DP-GRPO and control; leaky and private audits; results page."""
    from dpgrpo.experiments.study import run_study

    say = (lambda message: None) if quiet else (lambda message: typer.echo(message, err=True))
    result = run_study(config, out, results_dir=results, sweep=sweep, say=say,
                       verbose=not quiet, workers=workers, dp_leaky=dp_leaky,
                       seeds=seeds)
    s = result["summary"]
    def ci(pair, digits: int = 1) -> str:
        return "[" + ", ".join(f"{x:.{digits}f}" for x in pair) + "]"

    leaky_dp = (f", leaky recipe under DP {s['audit_dp_leaky_auc']:.3f} "
                f"{ci(s['audit_dp_leaky_auc_ci'], 3)}" if "audit_dp_leaky_auc" in s else "")
    def runs(key: str) -> str:                    # seeds then problems, when there are seeds
        pair = s.get(f"{key}_ci_runs")
        return "" if pair is None else f" ({ci(pair)} over seeds and problems)"

    typer.echo(f"non-private gain {s['nonprivate_gain_pp']:+.1f} pp {ci(s['nonprivate_gain_ci'])}"
               f"{runs('nonprivate_gain')}; DP-GRPO vs control {s['dp_vs_control_pp']:+.1f} pp "
               f"{ci(s['dp_vs_control_ci'])}{runs('dp_vs_control')} "
               f"(MDE {s['dp_vs_control_mde']:.1f}, noise/signal {s['noise_to_signal']:.1f}); "
               f"DIBA AUC leaky {s['audit_leaky_auc']:.3f} {ci(s['audit_leaky_auc_ci'], 3)}, DP "
               f"{s['audit_dp_auc']:.3f} {ci(s['audit_dp_auc_ci'], 3)}{leaky_dp}; canary bound "
               f"{s['canary_eps_lower_bound']:.3f} vs certified {s['certified_eps']:.3f}; "
               f"{s['wall_seconds'] / 60:.1f} min")
    from dpgrpo.evaluation.stats import MIN_SEEDS_FOR_CLAIM

    fewest = min((s[k] for k in ("nonprivate_gain_seeds", "dp_vs_control_seeds",
                                 "dp_vs_warm_start_seeds") if s.get(k) is not None), default=None)
    if fewest is not None and fewest < MIN_SEEDS_FOR_CLAIM:
        typer.echo(f"warning: the headline claims rest on {fewest} seed(s) of an arm, fewer "
                   f"than {MIN_SEEDS_FOR_CLAIM}; rerun with --seeds {MIN_SEEDS_FOR_CLAIM} "
                   "before making them (RL runs differ a lot from seed to seed)", err=True)
    typer.echo(f"wrote {results / 'cpu-study.md'} and {results / 'cpu-study.json'}")


def register(app: typer.Typer) -> None:
    """Add `dpgrpo study` to the app."""
    app.command("study")(study_cmd)
