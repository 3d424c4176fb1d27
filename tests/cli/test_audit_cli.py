"""`dpgrpo audit mia` and `dpgrpo audit canary` on a fabricated run (tiny model)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from audit_toy import make_toy_run, toy_problems, write_jsonl
from dpgrpo.cli import audit as audit_cli


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()
    audit_cli.register(app)

    @app.callback()
    def _root() -> None:
        """Test root."""

    return app


def test_every_command_has_help(app):
    for cmd in audit_cli.audit_app.registered_commands:
        assert cmd.callback.__doc__
    result = CliRunner().invoke(app, ["audit", "--help"])
    assert result.exit_code == 0 and "mia" in result.output and "canary" in result.output


def test_mia_help_names_the_stopping_rule(app):
    result = CliRunner().invoke(app, ["audit", "mia", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--stop-after" in result.output
    assert "Besag & Clifford" in result.output


def test_audit_commands_end_to_end(app, tiny_model_dir, tmp_path):
    run = make_toy_run(tmp_path / "run", tiny_model_dir, n_canaries=10)
    mem = write_jsonl(tmp_path / "m.jsonl", toy_problems("m", 6))
    non = write_jsonl(tmp_path / "n.jsonl", toy_problems("n", 6, start=6))
    small = ["--samples", "2", "--max-new-tokens", "3"]
    res = CliRunner().invoke(app, ["audit", "mia", "--run", str(run), "--members", str(mem),
                                   "--nonmembers", str(non), "--out", str(tmp_path / "mia"),
                                   "--folds", "2", "--trees", "5", "--permutations", "3",
                                   *small])
    assert res.exit_code == 0, res.output
    assert "DIBA: AUC" in res.output and "Permutation test (3 label shuffles" in res.output
    summary = json.loads((tmp_path / "mia" / "summary.json").read_text())
    assert summary["diba"]["n_folds"] == 2 and summary["diba"]["n_estimators"] == 5
    test = summary["permutation"]
    assert test["permutations"] == 3 and test["observed"] == summary["diba"]["pooled"]["auc"]
    assert test["p_value"] in (0.25, 0.5, 0.75, 1.0)
    assert test["stop_after"] is None          # the default h = 10 >= 3 shuffles: the fixed test
    assert "one-sided p" in (tmp_path / "mia" / "report.md").read_text()
    # --base-samples: the first audit draws the base's samples into the file, a second reads it
    shared = tmp_path / "base.json"
    for name in ("mia-a", "mia-b"):
        res = CliRunner().invoke(app, ["audit", "mia", "--run", str(run), "--members", str(mem),
                                       "--nonmembers", str(non), "--out", str(tmp_path / name),
                                       "--folds", "2", "--trees", "5", "--no-baselines",
                                       "--base-samples", str(shared), *small])
        assert res.exit_code == 0, res.output
    assert json.loads(shared.read_text())["key"]["candidates"] == 12
    assert (tmp_path / "mia-a" / "candidates.jsonl").read_text() == \
        (tmp_path / "mia-b" / "candidates.jsonl").read_text()

    res = CliRunner().invoke(app, ["audit", "canary", "--run", str(run), "--out",
                                   str(tmp_path / "canary"), "--k-plus", "2", "--k-minus", "2",
                                   *small])
    assert res.exit_code == 0, res.output
    assert "certified epsilon 8.000" in res.output
    summary = json.loads((tmp_path / "canary" / "summary.json").read_text())
    assert (summary["m"], summary["r"], summary["confidence"]) == (10, 4, 0.95)
    assert "empirical epsilon lower bound" in (tmp_path / "canary" / "report.md").read_text()
