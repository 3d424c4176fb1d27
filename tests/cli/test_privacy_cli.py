"""`dpgrpo privacy` and `dpgrpo verify` from the command line: JSON contract and bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpgrpo.privacy.accounting import PrivacyLedger, compute_epsilon


def _dpgrpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpgrpo", *args], capture_output=True, text=True,
                          timeout=300)


def test_calibrate_json_contract():
    out = _dpgrpo("privacy", "calibrate", "--n", "6961", "--expected-batch", "128", "--steps",
                  "100", "--epsilon", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"sigma", "epsilon", "delta", "q", "steps", "rdp_epsilon"} <= data.keys()
    assert abs(data["sigma"] / 0.5196564674377442 - 1) < 1e-6
    assert data["epsilon"] <= 8.0 and data["delta"] == pytest.approx(1 / 69610)
    assert data["q"] == pytest.approx(128 / 6961) and data["steps"] == 100


def test_epsilon_json_contract():
    out = _dpgrpo("privacy", "epsilon", "--n", "6988", "--expected-batch", "128", "--steps", "50",
                  "--sigma", "0.4842404738068581", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert round(data["epsilon"], 3) == 8.0 and data["rdp_epsilon"] == pytest.approx(9.83, rel=0.01)
    assert data["delta"] == pytest.approx(1 / 69880)


@pytest.mark.parametrize("args", [
    ["epsilon", "--n", "100", "--expected-batch", "10", "--steps", "5", "--sigma", "0"],
    ["epsilon", "--n", "100", "--expected-batch", "10", "--steps", "5", "--sigma", "-1"],
    ["calibrate", "--n", "100", "--expected-batch", "200", "--steps", "5", "--epsilon", "1"],
    ["calibrate", "--n", "100", "--expected-batch", "10", "--steps", "5", "--epsilon", "0"],
    ["calibrate", "--n", "100", "--expected-batch", "10", "--steps", "5", "--epsilon", "1",
     "--delta", "1"],
])
def test_bad_arguments_exit_nonzero_with_one_line(args):
    out = _dpgrpo("privacy", *args)
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""


def test_ledger_command_recomputes_epsilon(tmp_path):
    ledger = PrivacyLedger()
    ledger.record(0.02, 1.0, 30)
    path = tmp_path / "ledger.json"
    path.write_text(ledger.to_json())
    out = _dpgrpo("privacy", "ledger", str(path), str(path), "--delta", "1e-5", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["rounds"] == 60 and data["runs"] == 2
    assert data["epsilon"] == pytest.approx(compute_epsilon(1000, 20, 60, 1.0, 1e-5).epsilon, rel=1e-9)


def test_verify_writes_record(tmp_path):
    record = tmp_path / "verify.json"
    out = _dpgrpo("verify", "--group", "mechanism", "--json", str(record))
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(record.read_text())
    names = {c["check"] for c in data["checks"]}
    assert {"global_sensitivity", "poisson_inclusion_frequency", "accountant_jax_privacy_reference",
            "noise_secret_bits", "noise_tail_delta"} <= names
    checks = {c["check"]: c for c in data["checks"]}
    assert checks["noise_secret_bits"]["measured"] >= 128
    assert checks["noise_tail_delta"]["measured"] <= checks["noise_tail_delta"]["tolerance"]
    assert data["passed"] and all(c["passed"] for c in data["checks"])


def test_verify_fails_when_a_check_fails(monkeypatch):
    from dpgrpo import verify

    verify._register_model_checks()  # register before swapping the list, not into the copy
    broken = verify.Check("always_fails", "mechanism", 0.0, "<=", "test", lambda: 1.0)
    monkeypatch.setattr(verify, "CHECKS", verify.CHECKS + [broken])
    results = verify.run_checks(("mechanism",))
    assert not results[-1].passed and results[-1].check == "always_fails"
