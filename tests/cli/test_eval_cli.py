"""`dpgrpo eval`, `dpgrpo rescore` and `dpgrpo score` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpgrpo.cli import app
from dpgrpo.errors import ConfigError
from dpgrpo.evaluation.predictions import SUMMARY_KEYS, read_predictions


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result


def test_eval_then_rescore_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _invoke("eval", "--task", "arithmetic", "--model", str(tiny_model_dir), "--out",
                     str(out), "--limit", "3", "--batch-size", "2", "--max-new-tokens", "8",
                     "--arm", "base", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert tuple(summary) == SUMMARY_KEYS and summary["n"] == 3
    assert json.loads((out / "summary.json").read_text()) == summary
    assert len(read_predictions(out / "predictions.jsonl")) == 3

    rescored = _invoke("rescore", str(out / "predictions.jsonl"), "--scorer", "strict",
                       "--json", "--out", str(tmp_path / "rescored.jsonl"))
    assert rescored.exit_code == 0, rescored.output
    report = json.loads(rescored.stdout)
    assert (report["n"], report["correct"], report["changed"]) == (
        3, summary["correct"]["strict"], 0)
    assert len(read_predictions(tmp_path / "rescored.jsonl")) == 3

    unknown = _invoke("rescore", str(out / "predictions.jsonl"), "--scorer", "robust")
    assert isinstance(unknown.exception, ConfigError)


@pytest.mark.parametrize("task, gold, response, expected", [
    ("math", "\\frac12", "So the answer is $0.5$.",
     {"strict": (None, False), "robust": ("0.5", True)}),
    ("math", "3", "\\boxed{3}", {"strict": ("3", True), "robust": ("3", True)}),
    ("gsm8k", "1234", "She pays $1,234.", {"strict": ("1234", True)}),
    ("svamp", "5", "no idea", {"strict": (None, False)}),
    ("csqa", "B", "Answer: A\nNo wait. Answer: B", {"strict": (None, False),
                                                     "final": ("B", True)}),
])
def test_score_json(task: str, gold: str, response: str, expected: dict) -> None:
    result = _invoke("score", "--task", task, "--gold", gold, "--response", response, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {role: (v["extracted"], v["correct"]) for role, v in data.items()} == expected


def test_score_honours_the_cap_and_choices() -> None:
    capped = _invoke("score", "--task", "math", "--gold", "2", "--response", "so x = 2",
                     "--hit-cap", "--json")
    assert json.loads(capped.stdout)["robust"] == {"extracted": None, "correct": False,
                                                   "timed_out": False}
    by_text = _invoke("score", "--task", "csqa", "--gold", "B", "--response", "Answer: library",
                      "--choice", "A=bank", "--choice", "B=library", "--json")
    assert json.loads(by_text.stdout)["final"]["correct"] is True
    both = _invoke("score", "--task", "gsm8k", "--gold", "1")
    assert isinstance(both.exception, ConfigError)


@pytest.mark.slow
def test_eval_real_model_on_a_handful_of_problems(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct, greedy, on eight easy arithmetic problems (about 30% correct)."""
    result = _invoke("eval", "--task", "arithmetic", "--model", "smollm2-135m", "--out",
                     str(tmp_path / "arith"), "--limit", "8", "--batch-size", "8", "--json")
    assert result.exit_code == 0, result.output
    predictions = read_predictions(tmp_path / "arith" / "predictions.jsonl")
    assert len(predictions) == 8
    assert all(any(ch.isdigit() for ch in p.response) for p in predictions)
    assert sum(p.scores["strict"].correct for p in predictions) >= 1
    assert all(0 < p.n_tokens <= 256 for p in predictions)
