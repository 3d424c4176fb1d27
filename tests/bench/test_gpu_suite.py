"""bench/gpu_suite.py's dry run: the GPU run's every part, shrunk, on the CPU, in one process
tree, so that the 15 device minutes are never spent on a broken script. Also the suite's own
time box: a part that hangs is killed with its children and recorded, and the next part runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_suite  # noqa: E402


def test_every_cuda_test_file_is_found_and_the_gpu_parts_fit_nine_minutes(tmp_path):
    files = gpu_suite.cuda_test_files()
    assert {"tests/rollout/test_engine.py", "tests/objectives/test_logprobs.py",
            "tests/privacy/test_mechanism.py"} <= set(files)
    gpu = gpu_suite.parts(False, tmp_path)
    assert [p.name for p in gpu] == ["paper_round", "step_overhead", "isolation", "cuda_tests"]
    assert sum(p.budget_s for p in gpu) <= 540 - 15          # room for the suite itself
    round_argv = gpu[0].argv
    assert "--prompts" not in round_argv and "--cap" not in round_argv   # the preset's shape
    assert "--synthetic-rollouts" not in round_argv and "--static" in round_argv


def test_a_hanging_part_is_killed_recorded_and_the_suite_moves_on(tmp_path):
    hang = gpu_suite.Part("hang", (sys.executable, "-c",
                                   "import subprocess, sys, time;"
                                   "subprocess.Popen([sys.executable, '-c', 'import time;"
                                   " time.sleep(600)']); print('{\"x\": 1}', flush=True);"
                                   " time.sleep(600)"), budget_s=2)
    record = gpu_suite.run_part(hang, 2.0, tmp_path)
    assert record["status"] == "timeout" and record["seconds"] < 60  # killed, not waited out
    crash = gpu_suite.Part("crash", (sys.executable, "-c", "raise SystemExit('no GPU here')"), 5)
    record = gpu_suite.run_part(crash, 5.0, tmp_path)
    assert record["status"] == "failed" and "no GPU here" in record["error"]


def test_the_dry_run_runs_every_part_on_the_cpu(tmp_path):
    """All four parts finish on the CPU at tiny shapes; their figures reach the JSON and the
    goals; isolation holds bit for bit in bf16 and fp32, the prompt's pass is shared, and the
    previous and current LoRA hooks give the same gradients up to rounding."""
    done = subprocess.run([sys.executable, "bench/gpu_suite.py", "--dry-run", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=4 * gpu_suite.DRY_BOX + 60)   # seconds when idle
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    errors = {k: v.get("error") for k, v in report["parts"].items() if v["status"] != "ok"}
    assert done.returncode == 0 and not errors, errors
    assert report["dry_run"] and report["environment"]["missing"] == []
    parts, goals = report["parts"], report["goals"]
    assert set(parts) == {"paper_round", "step_overhead", "isolation", "cuda_tests"}
    assert [p["phase"] for p in parts["paper_round"]["phases_seen"]] == [
        "load", "rollouts", "to_device", "reference_pass", "per_prompt_grads", "mechanism",
        "adamw_step", "hooks_ab"]
    # the same gradients either way, up to fp32 rounding: on one commit the max over tensors
    # of the relative difference stayed below 1e-5 in four runs and reached 3.9e-5 in two (a
    # 1e-5 bound failed CI once); 5e-4 still fails any hook that changes the gradient
    ab = parts["paper_round"]["result"]["hooks_ab"]
    assert 0 < ab["max_tensor_relative_difference"] < 5e-4 and goals["hooks_speedup"] > 0
    assert goals["prompt_sharing"] is True and goals["round_seconds"] > 0
    assert goals["fast_time_ratio"] > 0 and goals["fast_memory_ratio"] > 0
    assert goals["gradients_bit_identical"] is True and goals["gradients_repeatable"] is True
    assert goals["gradients_bit_identical_deterministic"] is True
    assert goals["isolated_rollouts_identical"] is True
    tests = parts["cuda_tests"]["result"]
    if not report["environment"]["cuda"]:
        assert tests["tests"] == tests["skipped"] >= 8     # collected, and skipped cleanly
    assert (tmp_path / "paper_round.log").read_text().startswith("$ ")


def test_goals_read_the_gpu_figures_and_say_none_for_a_missing_part():
    """The round's peak is the largest CUDA allocation of its phases (the A/B after it does
    not count); a part that produced nothing leaves its goals None, not False."""
    rnd = {"round_seconds": 115.0, "prompt_sharing": True, "hooks_ab": {"speedup": 1.08},
           "peak_memory": {"rollouts": {"allocated_bytes": 41.7e9},
                           "per_prompt_grads": {"allocated_bytes": 37.5e9},
                           "hooks_ab": {"allocated_bytes": 90e9}}}
    ovh = {"fast_time_ratio": 1.05, "fast_memory_ratio": 1.3}
    goals = gpu_suite.goals({"paper_round": {"result": rnd}, "step_overhead": {"result": ovh},
                             "isolation": {"status": "timeout"}})
    assert goals["round_le_120_s"] is True and goals["round_le_90_s"] is False
    assert goals["peak_allocated_gb"] == 41.7 and goals["peak_le_80_gb"] is True
    assert goals["fast_time_le_1_10"] is True and goals["fast_memory_le_1_2"] is False
    assert goals["gradients_bit_identical"] is None and goals["cuda_tests_passed"] is None
