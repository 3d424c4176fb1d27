"""`dpgrpo privacy report` and `dpgrpo protocol` from the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpgrpo.cli import app
from dpgrpo.errors import ConfigError

GSM8K_SIGMA = 0.5196564674377442  # Table VII: GSM8K and CSQA, all arms

def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_privacy_report_calibrates_the_gsm8k_setting(tmp_path: Path) -> None:
    """n = 6,961 slots, m = 128, T = 100, epsilon = 8: sigma of Table VII, PLD 8.000."""
    cfg = tmp_path / "gsm8k-shape.toml"
    cfg.write_text('[data]\ntask = "arithmetic"\nn_slots = 6961\n[privacy]\nepsilon = 8.0\n'
                   "expected_batch = 128\n[train]\nrounds = 100\n")
    out = tmp_path / "report" / "budget.md"
    result = _invoke("privacy", "report", str(cfg), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout.strip().splitlines()[0])["rows"]
    assert row["configuration"] == "gsm8k-shape"
    assert (row["n"], row["m"], row["T"]) == (6961, 128, 100)
    assert row["sigma"] == pytest.approx(GSM8K_SIGMA, rel=1e-6) and row["sigma_calibrated"]
    assert row["pld_epsilon"] <= 8.0 and round(row["pld_epsilon"], 3) == 8.0
    assert row["delta"] == pytest.approx(1 / 69610) and row["rdp_order"] == 2.3
    assert json.loads((tmp_path / "report" / "budget.json").read_text()) == [row]
    assert "| gsm8k-shape | 6,961 | 1.44e-05 | (128, 0.520, 100) | 8.000 |" in out.read_text()

    bad = _invoke("privacy", "report", str(cfg), "--out", str(out), "--set", "data.n_slots=10",
                  "--set", "privacy.expected_batch=4")
    assert isinstance(bad.exception, ConfigError) and "smaller than the 1000 records" in str(
        bad.exception)


def test_protocol_command_runs_resumes_and_reports(tiny_protocol_toml: Path,
                                                   tmp_path: Path) -> None:
    cfg = tiny_protocol_toml
    out = tmp_path / "protocol"
    args = ["protocol", str(cfg), "--seeds", "2", "--arms", "dp-grpo",
            "--non-private", "--eval-limit", "6", "--no-figures", "--out", str(out)]
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["dp-grpo-seed1", "dp-grpo-seed2", "non-private-seed1"]
    for name in runs:
        summary = json.loads((out / "runs" / name / "eval" / "summary.json").read_text())
        assert summary["n"] == 6 and summary["seed"] == int(name[-1])  # CLI beats [protocol]
    certs = [json.loads((out / "runs" / n / "release" / "certificate.json").read_text())
             for n in runs]
    assert certs[0]["epsilon"] == certs[1]["epsilon"] < math.inf
    assert not certs[2]["private"] and not certs[2]["releasable"]
    report = json.loads((out / "compare" / "report.json").read_text())
    assert [a["name"] for a in report["arms"]] == ["base", "dp-grpo", "non-private"]
    assert not list((out / "compare").glob("*.png"))
    assert "base: strict accuracy" in result.stdout and "wrote" in result.stdout

    again = _invoke(*args)
    assert again.exit_code == 0, again.output
    assert again.stderr.count("complete, skipped") == 3

    unknown = _invoke("protocol", str(cfg), "--arms", "dp-grpo,sft", "--out", str(out))
    assert isinstance(unknown.exception, ConfigError) and "unknown protocol arm 'sft'" in str(
        unknown.exception)
