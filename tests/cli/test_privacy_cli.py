"""`dpgrpo privacy` and `dpgrpo verify` from the command line: JSON contract and bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpgrpo.privacy.accounting import PrivacyLedger, epsilon_report


def _dpgrpo(*args: str) -> subprocess.CompletedProcess:
    # no wall-clock limit here: a loaded CI machine may take longer than any fixed one, and
    # CI's own job timeout ends a hang (issue 57)
    return subprocess.run([sys.executable, "-m", "dpgrpo", *args], capture_output=True, text=True)


def test_calibrate_json_contract():
    out = _dpgrpo("privacy", "calibrate", "--n", "6961", "--expected-batch", "128", "--rounds",
                  "100", "--epsilon", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"sigma", "epsilon", "delta", "q", "rounds", "rdp_epsilon"} <= data.keys()
    assert abs(data["sigma"] / 0.5196564674377442 - 1) < 1e-6
    assert data["epsilon"] <= 8.0 and data["delta"] == pytest.approx(1 / 69610)
    assert data["q"] == pytest.approx(128 / 6961) and data["rounds"] == 100


def test_epsilon_json_contract():
    out = _dpgrpo("privacy", "epsilon", "--n", "6988", "--expected-batch", "128", "--rounds", "50",
                  "--sigma", "0.4842404738068581", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert round(data["epsilon"], 3) == 8.0 and data["rdp_epsilon"] == pytest.approx(9.83, rel=0.01)
    assert data["delta"] == pytest.approx(1 / 69880)


@pytest.mark.parametrize("args", [
    ["epsilon", "--n", "100", "--expected-batch", "10", "--rounds", "5", "--sigma", "0"],
    ["epsilon", "--n", "100", "--expected-batch", "10", "--rounds", "5", "--sigma", "-1"],
    ["calibrate", "--n", "100", "--expected-batch", "200", "--rounds", "5", "--epsilon", "1"],
    ["calibrate", "--n", "100", "--expected-batch", "10", "--rounds", "5", "--epsilon", "0"],
    ["calibrate", "--n", "100", "--expected-batch", "10", "--rounds", "5", "--epsilon", "1",
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
    expected = epsilon_report(1000, 20, 60, 1.0, 1e-5).epsilon
    assert data["epsilon"] == pytest.approx(expected, rel=1e-9)


def test_verify_writes_record(tmp_path):
    record = tmp_path / "verify.json"
    out = _dpgrpo("verify", "--group", "mechanism", "--out", str(record))
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(record.read_text())
    names = {c["check"] for c in data["checks"]}
    assert {"global_sensitivity", "poisson_inclusion_frequency", "accountant_jax_privacy_reference",
            "noise_secret_bits", "noise_tail_delta"} <= names
    checks = {c["check"]: c for c in data["checks"]}
    assert checks["noise_secret_bits"]["measured"] >= 128
    # issue 32: the randomness checks, in the JSON record with their numbers
    assert checks["noise_block_repeats"]["measured"] == 0
    assert checks["noise_pairs_per_coordinate"]["measured"] == 4
    assert checks["poisson_coin_resolution_bits"]["measured"] == 53
    assert checks["poisson_small_q_frequency_z"]["measured"] < 6
    assert checks["record_randomness_secret_bits"]["measured"] == 256
    assert checks["record_randomness_binding"]["measured"] == 0
    assert checks["noise_tail_delta"]["measured"] <= checks["noise_tail_delta"]["tolerance"]
    assert data["passed"] and all(c["passed"] for c in data["checks"])


def test_verify_fails_when_a_check_fails(monkeypatch):
    from dpgrpo import verify

    verify._register_model_checks()  # register before swapping the list, not into the copy
    broken = verify.Check("always_fails", "mechanism", 0.0, "<=", "test", lambda: 1.0)
    monkeypatch.setattr(verify, "CHECKS", [*verify.CHECKS, broken])
    results = verify.run_checks(("mechanism",))
    assert not results[-1].passed and results[-1].check == "always_fails"


def _convert(*args: str) -> dict:
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    result = CliRunner().invoke(app, ["privacy", "convert", *args, "--json"])  # in process: the
    assert result.exit_code == 0, result.output  # round PLDs built once are cached for the rest
    return json.loads(result.output)


MECHANISM = ["--n", "1000", "--expected-batch", "20", "--rounds", "30", "--sigma", "1.0"]


def test_convert_accounts_the_mechanism_and_the_ledger(tmp_path):
    from dpgrpo.privacy.accounting import RoundEvent, group_epsilon, replace_one_epsilon

    events = [RoundEvent(0.02, 1.0, 30)]
    group = _convert(*MECHANISM, "--group", "3")  # delta defaults to 1/(10 n)
    assert {"epsilon", "delta", "relation", "group", "method"} <= group.keys()
    assert (group["relation"], group["group"], group["method"], group["delta"]) == \
        ("add-or-remove-one", 3, "pld-accountant", 1e-4)
    assert group["epsilon"] == group_epsilon(events, 1e-4, 3)
    ledger = PrivacyLedger(events)
    path = tmp_path / "ledger.json"
    path.write_text(ledger.to_json())
    replace = _convert("--ledger", str(path), "--delta", "1e-4", "--relation", "replace-one")
    assert (replace["relation"], replace["group"], replace["method"]) == \
        ("replace-one", 1, "pld-accountant")
    assert replace["epsilon"] == replace_one_epsilon(events, 1e-4)
    cert = tmp_path / "certificate.json"  # a release's certificate carries its ledger
    cert.write_text(json.dumps({"epsilon": 1.0, "ledger": ledger.to_dict()}))
    assert _convert("--ledger", str(cert), "--delta", "1e-4", "--group", "3") == group
    swap = _convert(*MECHANISM, "--group", "2", "--relation", "replace-one")
    assert swap["method"] == "generic-conversion" and swap["delta"] == 1e-4


def test_convert_from_epsilon_alone_is_the_generic_conversion():
    data = _convert("--epsilon", "8", "--delta", "1e-5", "--group", "3")
    assert data["method"] == "generic-conversion" and data["meaningful"] is False
    assert data["epsilon"] == 24.0 and data["delta"] == pytest.approx(266.58, abs=0.01)
    data = _convert("--epsilon", "8", "--delta", "1e-4", "--relation", "replace-one")
    assert (data["epsilon"], round(data["delta"], 3), data["relation"]) == (
        16.0, 0.298, "replace-one")


@pytest.mark.parametrize("args", [
    ["--epsilon", "8"],  # no delta
    ["--epsilon", "8", "--delta", "1e-5", *MECHANISM],  # two sources
    [],  # no source
    ["--n", "1000", "--rounds", "30"],  # incomplete mechanism
    [*MECHANISM[:-1], "0"],  # sigma 0
    [*MECHANISM, "--group", "0"],
    [*MECHANISM, "--relation", "swap"],
    ["--ledger", "/nonexistent/ledger.json", "--delta", "1e-5"],
    ["--ledger", "ledger.json"],  # no delta
])
def test_convert_bad_arguments_exit_2_with_one_line(args):
    out = _dpgrpo("privacy", "convert", *args)
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""
