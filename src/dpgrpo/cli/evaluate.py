"""`dpgrpo eval`, `dpgrpo rescore`, `dpgrpo score`: greedy evaluation and (re)scoring."""

from __future__ import annotations

import json
from pathlib import Path

import typer

TASK_HELP = "arithmetic, gsm8k, math, csqa, svamp, or package.module:attr."
DATA_HELP = "Folder holding the benchmark files (e.g. ../shared/data)."
SOURCE_HELP = "local (files in --data-dir) or hub (Hugging Face datasets; needs internet)."


def eval_cmd(
    task: str | None = typer.Option(None, "--task", help=TASK_HELP),
    model: str | None = typer.Option(
        None, "--model", help="Alias (smollm2-135m), model folder, .gguf or hub id."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Folder for predictions.jsonl and summary.json."),
    run: Path | None = typer.Option(
        None, "--run", help="A training run: model, task, adapter, arm, data, dtype and device "
                            "from its release/ (options given here win)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_HELP),
    source: str | None = typer.Option(None, "--source", help=SOURCE_HELP),
    split: str = typer.Option("eval", "--split", help="Split to evaluate."),
    adapter: Path | None = typer.Option(
        None, "--adapter", help="Released adapter folder (default: the base model)."),
    limit: int | None = typer.Option(
        None, "--limit", help="Only the first N problems (quick CPU runs)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per generate call."),
    max_new_tokens: int | None = typer.Option(
        None, "--max-new-tokens", help="Completion cap (default: the task's)."),
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32, bfloat16, float16 (default: the run's, else float32)."),
    device: str | None = typer.Option(
        None, "--device", help="auto, cpu, cuda, ... (default: the run's, else auto: a GPU "
                               "when there is one)."),
    arm: str | None = typer.Option(
        None, "--arm", help="Label recorded in the summary (e.g. dp-grpo)."),
    seed: int | None = typer.Option(
        None, "--seed", help="Training seed recorded in the summary."),
    skip_invalid: bool = typer.Option(
        False, "--skip-invalid", help="Skip invalid records (listed)."),
    check_timeout: float = typer.Option(
        10.0, "--check-timeout", help="Seconds per symbolic check."),
    engine: str | None = typer.Option(
        None, "--engine", help="Rollout engine: transformers or vllm (CUDA; needs "
                               "'dpgrpo\\[vllm]'); default: the run's, else transformers."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Greedy decoding, one completion per problem; resumable (skips finished ids)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from dpgrpo.errors import ConfigError
    from dpgrpo.evaluation.evaluate import EvalSettings, run_eval
    from dpgrpo.release.files import eval_defaults

    found = eval_defaults(run) if run is not None else {}
    model, task = model or found.get("model"), task or found.get("task")
    adapter, arm = adapter or found.get("adapter"), arm or found.get("arm")
    run_data = found.get("data_dir")
    data_dir = data_dir or (Path(run_data) if run_data else None)
    if task is None or model is None:
        raise ConfigError("give --task and --model, or --run RUN_DIR")
    settings = EvalSettings(task=task, model=model, out_dir=out, data_dir=data_dir, split=split,
                            adapter=adapter, limit=limit, batch_size=batch_size,
                            max_new_tokens=max_new_tokens,
                            dtype=dtype or found.get("dtype", "float32"),
                            device=device or found.get("device", "auto"), arm=arm, seed=seed,
                            skip_invalid=skip_invalid, check_timeout_s=check_timeout,
                            source=source or found.get("source", "local"),
                            engine=engine or found.get("engine", "transformers"))
    from dpgrpo.cli._progress import CountLines, interactive, say

    if not interactive():  # nohup, CI, a pipe: plain lines (a bar would show only at the end)
        say(f"evaluating {task} with {model}: loading the model")
        summary = run_eval(settings, progress=CountLines(f"eval {task}"))
    else:
        columns = ("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=as_json) as bar:
            job = bar.add_task(f"eval {task}", total=None)
            summary = run_eval(settings, progress=lambda done, total: bar.update(
                job, completed=done, total=total))
    _emit_summary(summary, as_json)


def rescore_cmd(
    predictions: Path = typer.Argument(..., help="A predictions.jsonl written by `dpgrpo eval`."),
    scorer: str = typer.Option(..., "--scorer", help="strict, robust (MATH) or final (CSQA)."),
    task: str | None = typer.Option(
        None, "--task", help="Default: from the summary.json beside it."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_HELP),
    split: str = typer.Option("eval", "--split", help="Split the predictions came from."),
    source: str = typer.Option("local", "--source", help=SOURCE_HELP),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip invalid records."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                       help="Write the rescored predictions here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Score saved predictions again with one scorer, without generating."""
    from dpgrpo.errors import ConfigError
    from dpgrpo.evaluation.predictions import (
        read_predictions,
        read_summary,
        rescore,
        write_predictions,
    )
    from dpgrpo.tasks import get_task, load_problems

    if task is None:
        summary_path = predictions.parent / "summary.json"
        if not summary_path.exists():
            raise ConfigError(f"no summary.json beside {predictions}: pass --task")
        task = str(read_summary(summary_path).get("task"))
    spec = get_task(task)
    problems = load_problems(spec, split, data_dir, skip_invalid=skip_invalid, source=source)
    result = rescore(read_predictions(predictions), problems, spec, scorer)
    if out is not None:
        write_predictions(out, result.predictions)
    report = {"task": spec.name, "scorer": scorer, "n": result.n, "correct": result.correct,
              "accuracy": result.accuracy, "verifier_timeouts": result.timeouts,
              "changed": result.changed}
    _emit_summary(report, as_json)


def score_cmd(
    task: str = typer.Option(..., "--task", help=TASK_HELP),
    gold: str = typer.Option(
        ..., "--gold", help="Reference answer (MATH: boxed content; CSQA: letter)."),
    response: str | None = typer.Option(
        None, "--response", help="The response text ('-': stdin)."),
    response_file: Path | None = typer.Option(
        None, "--response-file", help="Read the response from a file."),
    choice: list[str] | None = typer.Option(
        None, "--choice", help="CSQA option as LABEL=TEXT (repeatable)."),
    hit_cap: bool = typer.Option(False, "--hit-cap", help="The response was cut at the token cap."),
    check_timeout: float = typer.Option(
        10.0, "--check-timeout", help="Seconds per symbolic check."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Extraction and verdict of every scorer of a task for one response (verifier debugging)."""
    import sys

    from dpgrpo.errors import ConfigError
    from dpgrpo.evaluation.predictions import score_response
    from dpgrpo.tasks import Problem, get_task

    if (response is None) == (response_file is None):
        raise ConfigError("give exactly one of --response and --response-file")
    if response_file is not None:
        text = response_file.read_text(encoding="utf-8")
    else:
        text = sys.stdin.read() if response == "-" else str(response)
    choices = None
    if choice:
        pairs = [c.split("=", 1) for c in choice]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError("--choice must look like LABEL=TEXT")
        choices = tuple((label.strip(), option.strip()) for label, option in pairs)
    spec = get_task(task, check_timeout_s=check_timeout)
    verdicts = score_response(spec, Problem("cli", "", gold, choices=choices), text,
                              hit_cap=hit_cap)
    report = {role: {"extracted": v.extracted, "correct": v.correct, "timed_out": v.timed_out}
              for role, v in verdicts.items()}
    if as_json:
        typer.echo(json.dumps(report))
        return
    for role, verdict in report.items():
        mark = "correct" if verdict["correct"] else "incorrect"
        note = " (timed out)" if verdict["timed_out"] else ""
        typer.echo(f"{role}: {mark}{note}; extracted: {verdict['extracted']!r}")


def _emit_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(summary))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False)
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.4f}"
        table.add_row(key, str(value))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("eval")(eval_cmd)
    app.command("rescore")(rescore_cmd)
    app.command("score")(score_cmd)
