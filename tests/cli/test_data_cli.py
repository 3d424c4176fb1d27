"""`dpgrpo data summary` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dpgrpo.cli import app
from dpgrpo.tasks import load_split


def _dpgrpo(*args: str) -> subprocess.CompletedProcess:
    # no wall-clock limit: CI's job timeout ends a hang (issue 57)
    return subprocess.run([sys.executable, "-m", "dpgrpo", *args], capture_output=True,
                          text=True)


def test_math_summary_json(shared_data_dir: Path) -> None:
    out = _dpgrpo("data", "summary", "--task", "math", "--data-dir", str(shared_data_dir),
                  "--json")
    data = json.loads(out.stdout)
    evaluation = load_split("math", "eval", shared_data_dir)
    assert data["eval"] == len(evaluation.problems)
    assert {k: data[k] for k in evaluation.excluded} == evaluation.excluded
    if (shared_data_dir / "math" / "test.jsonl").read_text().count("\n") == 5000:
        assert data["eval"] == 4499
    if "errors" in data:  # the real MATH train split has records with an empty \boxed{}
        assert data["train"] is None and out.returncode == 1
        assert ", line " in data["errors"]["train"] and "--skip-invalid" in out.stderr
    else:
        assert out.returncode == 0


def test_summary_skip_invalid_lists_what_it_skipped(shared_data_dir: Path) -> None:
    result = CliRunner().invoke(app, ["data", "summary", "--task", "math", "--data-dir",
                                      str(shared_data_dir), "--skip-invalid", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    train = load_split("math", "train", shared_data_dir, skip_invalid=True)
    assert data["train"] == len(train.problems)
    assert data["skipped"] == [str(err) for err in train.skipped]
    assert set(data) == {"train", "eval", "excluded_math500", "excluded_duplicates", "skipped"}


def test_summary_of_other_tasks(shared_data_dir: Path) -> None:
    runner = CliRunner()
    for task, train_available in (("gsm8k", True), ("csqa", False), ("svamp", False),
                                  ("arithmetic", True)):
        result = runner.invoke(app, ["data", "summary", "--task", task, "--data-dir",
                                     str(shared_data_dir), "--json"])
        assert result.exit_code == 0, (task, result.output)
        data = json.loads(result.stdout)
        assert set(data) == {"train", "eval"}
        assert (data["train"] is not None) is train_available
        assert data["eval"] == len(load_split(task, "eval", shared_data_dir).problems)
    table = runner.invoke(app, ["data", "summary", "--task", "arithmetic"])
    assert table.exit_code == 0 and "1,000" in table.stdout


def test_bad_arguments_give_one_line_errors(tmp_path: Path) -> None:
    out = _dpgrpo("data", "summary", "--task", "nope", "--data-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "unknown task 'nope'" in out.stderr
    missing = _dpgrpo("data", "summary", "--task", "gsm8k", "--data-dir", str(tmp_path), "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout)["eval"] is None
