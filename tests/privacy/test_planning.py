"""`dpgrpo privacy plan`: candidate (m, G, T) for a compute budget, from public inputs only."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from dpgrpo.errors import ConfigError
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.privacy.calibration import calibrate_sigma, planning_sigma
from dpgrpo.privacy.planning import noise_to_signal, plan


def test_planning_sigma_sits_just_above_the_exact_calibration():
    exact = calibrate_sigma(1000, 8, 12, 8.0, 1e-4)        # the CPU study's point: 0.34412
    quick = planning_sigma(1000, 8, 12, 8.0, 1e-4)
    assert exact <= quick <= exact * 1.002
    assert compute_epsilon(1000, 8, 12, quick, 1e-4).epsilon <= 8.0   # it meets the target


def test_plan_rows_fill_the_budget_and_rank_by_noise_to_signal():
    rows = plan(1000, 8.0, 576, 19_584, delta=1e-4, batches=(8, 16), groups=(4, 6))
    assert {(r.m, r.G, r.T) for r in rows} == {(8, 4, 18), (8, 6, 12), (16, 4, 9), (16, 6, 6)}
    for r in rows:
        assert r.completions == r.m * r.G * r.T <= 576
        assert r.noise_to_signal == pytest.approx(r.sigma * math.sqrt(19_584) / r.m)
    assert [r.noise_to_signal for r in rows] == sorted(r.noise_to_signal for r in rows)
    today = next(r for r in rows if (r.m, r.G) == (8, 6))
    assert today.noise_to_signal == pytest.approx(6.02, abs=0.01)   # the r = 6.0
    assert noise_to_signal(0.3441, 6_912, 8) == pytest.approx(3.58, abs=0.01)  # FFA-LoRA's p


def test_plan_refuses_what_cannot_be_planned():
    with pytest.raises(ConfigError, match="delta"):
        plan(100, 8.0, 100, 10, delta=0.05)
    with pytest.raises(ConfigError, match="no candidate fits"):
        plan(100, 8.0, 3, 10, batches=(4,), groups=(4,))


def test_plan_cli_prints_json_and_reads_no_data():
    # no time bound: CI has its own
    out = subprocess.run([sys.executable, "-m", "dpgrpo", "privacy", "plan", "--n", "1000",
                          "--epsilon", "8", "--budget", "576", "--params", "6912", "--m", "8,16",
                          "--G", "6", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["delta"] == pytest.approx(1e-4) and data["trainable_params"] == 6912
    assert data["data_read"].startswith("none")
    assert [(r["m"], r["G"], r["T"]) for r in data["rows"]] == [(16, 6, 6), (8, 6, 12)]
