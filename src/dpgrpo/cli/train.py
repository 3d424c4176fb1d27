"""`dpgrpo train`: run (or resume) DP-GRPO and its comparator arms."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, NoReturn

import typer


def train_cmd(
    config: Path | None = typer.Argument(
        None, help="TOML config (default: the embedded CPU demo)."
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override: section.key=value (repeatable)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Run directory (default runs/<arm>-<time>)."
    ),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in RUN_DIR."),
    arm: str | None = typer.Option(None, "--arm", help="Shortcut for --set train.arm=..."),
    rounds: int | None = typer.Option(None, "--rounds", help="Shortcut for --set train.rounds=..."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Shortcut for privacy.epsilon."),
    model: str | None = typer.Option(None, "--model", help="Shortcut for model.name."),
    task: str | None = typer.Option(
        None,
        "--task",
        help="Shortcut for data.task: a task name, package.module:attr (a "
        "task or a factory), or an entry point of group dpgrpo.tasks.",
    ),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Shortcut for data.data_dir."),
    seed: int | None = typer.Option(None, "--seed", help="Debug seed: the run is NOT releasable."),
    metrics: str | None = typer.Option(
        None,
        "--metrics",
        help="Shortcut for train.metrics: jsonl, tensorboard, wandb "
        "(comma-separated); public values only.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress (bar or lines)."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the result as one JSON object (implies --quiet)."
    ),
    show_private: bool = typer.Option(
        False,
        "--show-private-telemetry",
        help="Also show each round's realized batch size and mean reward: private training "
        "data, not covered by the guarantee (debugging only).",
    ),
) -> None:
    """Train a LoRA adapter with prompt-level (or contributor-level) DP (Algorithm 1); writes
    release/ and recovery/."""
    from dpgrpo.config import apply_overrides, embedded_default, load_config
    from dpgrpo.training.trainer import train

    if resume is not None:
        if config is not None or overrides:
            raise typer.BadParameter("--resume continues a run with its saved config; "
                                     "drop the config file and --set overrides")
        run_dir, cfg = resume, None
    else:
        shortcuts = {"train.arm": arm, "train.rounds": rounds, "privacy.epsilon": epsilon,
                     "model.name": model, "data.task": task, "data.data_dir": data_dir,
                     "privacy.seed": seed, "train.metrics": metrics}
        extra = [f"{k}={v}" for k, v in shortcuts.items() if v is not None] + list(overrides)
        # the file and the overrides are validated together (one may complete the other)
        cfg = (load_config(config, extra) if config is not None
               else apply_overrides(embedded_default(), extra))
        _check_inputs(cfg)  # a bad task or model fails here, before any directory exists
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = out or Path("runs") / f"{cfg.train.arm}-{stamp}"
        typer.echo(f"run directory: {run_dir}", err=True)
    total = cfg.train.rounds if cfg is not None else None
    if show_private:
        typer.echo("WARNING: --show-private-telemetry prints per-round batch sizes and rewards, "
                   "which are computed from the private data and are NOT covered by the "
                   "privacy guarantee; do not share this output or its logs.", err=True)
    quiet = quiet or as_json
    if not quiet:
        from dpgrpo.cli._progress import say

        say(f"resuming {run_dir}: loading the model and the checkpoint (the next round follows)"
            if cfg is None else "setting up (the first round follows)")
    timings = show_private or (cfg is not None and cfg.train.public_timings)
    try:
        with _phase_lines(quiet), _progress(quiet, total, timings=timings) as on_round:
            result = train(cfg, run_dir, resume=resume is not None, progress=on_round,
                           show_private=show_private)
    except KeyboardInterrupt:
        _interrupted(run_dir)
    cert = result.certificate
    if as_json:
        typer.echo(json.dumps({
            "run_dir": str(result.run_dir), "release": str(result.release_dir),
            "epsilon": cert.get("epsilon"), "delta": cert.get("delta"),
            "releasable": cert.get("releasable"), "rounds": result.rounds_done,
            "steps_skipped": result.steps_skipped}))
        return
    status = (
        "releasable"
        if cert.get("releasable")
        else f"NOT releasable ({cert.get('not_releasable_because')})"
    )
    typer.echo(f"release: {result.release_dir}  (epsilon={cert.get('epsilon'):.4g}, "
               f"delta={cert.get('delta'):.3g}, {status}; {result.steps_skipped} steps skipped)")


def _phase_lines(quiet: bool) -> contextlib.AbstractContextManager[None]:
    """The trainer's phase lines on stderr (reading the data, calibrating sigma, loading the
    model), unless quiet."""
    from dpgrpo.cli._progress import phase_lines

    return contextlib.nullcontext() if quiet else phase_lines()


def _check_inputs(cfg) -> None:
    """Resolve the task and the model name (no loading): errors name the bad value."""
    from dpgrpo.model import check_hub_reachable, resolve_model
    from dpgrpo.tasks import get_task
    from dpgrpo.training.setup import resolve_device

    get_task(cfg.data.task)
    if resolve_model(cfg.model.name).is_hub_id:  # offline: say so now, not after retries
        check_hub_reachable(cfg.model.name)
    resolve_device(cfg.model.device)


def _interrupted(run_dir: Path) -> NoReturn:
    """Ctrl-C: say what was kept and how to continue; exit status 130 (128 + SIGINT)."""
    from dpgrpo.cli import INTERRUPTED
    from dpgrpo.cli._progress import say_interrupted
    from dpgrpo.rundir.layout import RunDir

    journal = RunDir(run_dir).journal
    if RunDir(run_dir).has_charges():
        say_interrupted(f"interrupted: every round started so far is charged to the privacy "
                        f"ledger ({journal}); continue with: dpgrpo train --resume {run_dir}")
    else:
        say_interrupted("interrupted before the first round: nothing was charged")
    raise typer.Exit(INTERRUPTED)


class _progress:
    """Training progress (public values; batch size and reward mean only when the trainer
    passes them, ``--show-private-telemetry``): on a terminal a rich bar (round of T, epsilon
    spent, elapsed time); elsewhere (nohup, CI, a pipe) one plain line per round, with elapsed
    time and ETA only when ``timings`` (they reveal the realized batch sizes: issue 32)."""

    def __init__(self, quiet: bool, total: int | None, *, timings: bool = False) -> None:
        self.quiet, self.total, self.timings, self.task = quiet, total, timings, None
        self.bar: Any = None                  # a rich Progress once entered (on a terminal)

    def __enter__(self):
        from dpgrpo.cli._progress import RoundLines, interactive, say

        if self.quiet:
            return lambda info: None
        if not interactive():
            lines = RoundLines(timings=self.timings)
            if not self.timings:
                say("progress: one line per round (round, epsilon spent); round times are "
                    "not shown, as they reveal the realized batch sizes "
                    "(train.public_timings = true shows elapsed time and ETA)")

            def on_line(info: dict) -> None:
                lines(info)
                if info["round"] == info["rounds"]:
                    say("writing release/ (adapter, certificate, model card)")
            return on_line
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("round"), MofNCompleteColumn(), BarColumn(),
                            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                            console=Console(stderr=True))
        self.bar.start()
        self.task = self.bar.add_task("train", total=self.total, status="loading")

        def on_round(info: dict) -> None:
            status = f"eps<={info['epsilon']:.3g}"
            if "batch_size" in info:  # private: only with --show-private-telemetry
                reward = info.get("reward_mean")
                reward_s = "-" if reward is None or reward != reward else f"{reward:.2f}"
                status = f"batch {info['batch_size']:3d}  reward {reward_s}  {status}"
            if info["round"] == info["rounds"]:
                status += "  writing release/"
            self.bar.update(self.task, completed=info["round"], total=info["rounds"], status=status)
        return on_round

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def register(app: typer.Typer) -> None:
    """Add `dpgrpo train` to the app."""
    app.command("train")(train_cmd)
