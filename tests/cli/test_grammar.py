"""One CLI grammar: config positional, -o/--out for outputs, --json prints one JSON object;
old spellings still work but are hidden; bad inputs fail before a run directory exists."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from dpgrpo import __version__
from dpgrpo.cli import app


def _options(path: list[str]) -> dict[str, bool]:
    """Every option string of a command -> whether it is hidden."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {opt: p.hidden for p in cmd.params for opt in getattr(p, "opts", [])
            if opt.startswith("-")}


def test_version():
    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.stdout.strip() == f"dpgrpo {__version__}"


def test_output_and_json_flags_agree_across_commands():
    for path in (["train"], ["eval"], ["compare"], ["protocol"], ["study"], ["audit", "mia"],
                 ["audit", "canary"], ["audit", "mechanism"], ["verify"]):
        opts = _options(path)
        assert opts.get("-o") is False and opts.get("--out") is False, path
    for path in (["train"], ["eval"], ["compare"], ["protocol"], ["verify"], ["push"],
                 ["rescore"], ["score"], ["data", "summary"], ["privacy", "epsilon"],
                 ["audit", "mechanism"]):
        assert _options(path).get("--json") is False, path
    # the spellings of 0.1 are gone (CHANGELOG.md), not hidden
    assert "--output-dir" not in _options(["train"]) and "--config" not in _options(["protocol"])
    assert "--replace-one" not in _options(["privacy", "convert"])
    # T is "rounds" everywhere: --steps is gone (a typer usage error), not an alias
    for path in (["train"], ["privacy", "calibrate"], ["privacy", "epsilon"],
                 ["privacy", "convert"]):
        assert "--steps" not in _options(path) and _options(path).get("--rounds") is False, path
    assert CliRunner().invoke(app, ["train", "--steps", "3"]).exit_code == 2


def test_verify_json_prints_and_out_writes_the_record(tmp_path, monkeypatch):
    from dpgrpo import verify

    class Check:
        check, group, measured = "c", "mechanism", 1.0
        comparison, tolerance, passed = "<=", 2.0, True

        def to_dict(self):
            return {"check": "c", "passed": True}

    monkeypatch.setattr(verify, "run_checks", lambda groups: [Check()])
    new = CliRunner().invoke(app, ["verify", "--json", "-o", str(tmp_path / "a.json")])
    assert new.exit_code == 0 and json.loads(new.stdout)["passed"] is True
    written = json.loads((tmp_path / "a.json").read_text())
    assert written["checks"] == [{"check": "c", "passed": True}]
    old = CliRunner().invoke(app, ["verify", "--json", str(tmp_path / "b.json")])
    assert old.exit_code != 0 and not (tmp_path / "b.json").exists()  # 0.1's spelling: gone


def test_bad_task_or_model_fails_before_the_run_directory(tmp_path):
    run = tmp_path / "x" / "run"
    bad_task = CliRunner().invoke(app, ["train", "--task", "nope", "-o", str(run), "--quiet"])
    assert "unknown task 'nope'" in str(bad_task.exception)
    assert "run directory" not in bad_task.output and not (tmp_path / "x").exists()
    bad_model = CliRunner().invoke(app, ["train", "--model", str(tmp_path / "missing.gguf"),
                                         "-o", str(run), "--quiet"])
    assert "GGUF file not found" in str(bad_model.exception) and not (tmp_path / "x").exists()


def test_eval_source_option_reaches_the_loader(tmp_path):
    out = CliRunner().invoke(app, ["eval", "--task", "arithmetic", "--model", "unused",
                                   "--source", "hub", "-o", str(tmp_path / "e")])
    assert "source must be 'local'" in str(out.exception)  # the arithmetic task is offline


def test_eval_engine_option_reaches_the_engine(tmp_path, tiny_model_dir):
    """`--engine vllm` is passed to make_engine (refused here: no vLLM, no GPU); an unknown
    engine name is refused before any model is loaded."""
    from dpgrpo.rollout.vllm_engine import vllm_available

    args = ["eval", "--task", "arithmetic", "--model", str(tiny_model_dir), "--limit", "1",
            "-o", str(tmp_path / "e")]
    if not vllm_available():
        out = CliRunner().invoke(app, [*args, "--engine", "vllm"])
        assert "needs vLLM" in str(out.exception)
    bad = CliRunner().invoke(app, [*args, "--engine", "tgi"])
    assert "engine must be one of transformers, vllm, got 'tgi'" in str(bad.exception)
