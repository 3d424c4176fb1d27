"""Every GPU figure the project still lacks, in one command of at most 9 minutes (issue 29).

A device session has 15 minutes in all, so this is prepared and tested on the CPU first
(``--dry-run`` shrinks every shape and runs the same code there) and then run once:

    python bench/gpu_suite.py                 # on the GPU; writes $OUT/gpu_suite.json
    python bench/gpu_suite.py --dry-run --out /tmp/suite    # on a CPU, about half a minute

Parts, each in its own process with its own time box (a crash, an out-of-memory error or a
hang in one is recorded as that part's error and the next part still runs), in this order:

* ``paper_round``: ``bench/gpu_round.py`` at the MATH preset's shape (128 prompts x G 8, 1,024
  new tokens forced to full length, random-weight Qwen2.5-1.5B-Instruct, bf16, rank-4 LoRA,
  dropout 0.05), rollouts replayed from CUDA graphs in calls of 1,024 rows, each prompt's pass
  shared by its G completions: seconds and peak memory per phase. The per-phase lines it
  prints as it goes are kept even if the part runs out of time. Then (``hooks_ab``) the
  per-prompt gradients of 16 prompts with the LoRA hooks before and after issue 29, alternating.
* ``step_overhead``: ``bench/step_overhead.py`` on the same architecture (bf16, dropout 0.05):
  the DP fast path's time and peak memory over one non-private update on the same batch.
* ``isolation``: ``bench/isolation.py`` in bf16 and fp32: isolated rollouts and each prompt's
  per-prompt gradient and reference log-probs, alone and with a longer batch-mate.
* ``cuda_tests``: ``pytest -m cuda`` over the test files that carry the marker.

The JSON (rewritten after every part, so a killed run still leaves what finished) holds the
environment, each part's status (``ok``, ``failed``, ``timeout``, ``skipped``), seconds,
command, parsed result or error tail, and ``goals``: issue 29's targets checked against the
figures (round <= 120 s, moonshot <= 90 s, within 80 GB; fast path <= 1.10x time and <= 1.2x
memory; isolation bit-identical; every CUDA test passing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: what the parts import; a missing one is named in the JSON instead of surfacing as a traceback
MODULES = ("torch", "transformers", "peft", "tokenizers", "numpy", "scipy", "pytest",
           "cryptography", "dp_accounting", "sympy", "math_verify", "typer", "rich")
#: a dry run's time box per part: its shapes take seconds, but a shared CPU can starve it
DRY_BOX = 600
DISTRIBUTIONS = {"dp_accounting": "dp-accounting", "math_verify": "math-verify"}
GB = 1e9


@dataclass(frozen=True)
class Part:
    """One time-boxed child process; ``budget_s`` is its share of the 9 minutes."""

    name: str
    argv: tuple[str, ...]
    budget_s: float
    kind: str = "json"            # json: the last JSON line of stdout; junit: pytest's XML


def cuda_test_files() -> list[str]:
    """Test files that use the ``cuda`` marker (named, so that collection never imports the
    test modules whose optional dependencies a bare GPU image lacks)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.cuda" in p.read_text())


def parts(dry_run: bool, out: Path) -> list[Part]:
    py = sys.executable
    junit = str(out / "cuda_tests.xml")
    pytest = (py, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-rfEs",
              "--continue-on-collection-errors", f"--junitxml={junit}", *cuda_test_files())
    if dry_run:
        return [
            Part("paper_round", (py, "bench/gpu_round.py", "--arch", "tiny", "--device", "cpu",
                                 "--prompts", "2", "--group", "2", "--cap", "6",
                                 "--prompt-len", "12", "--rollout-rows", "4",
                                 "--max-tokens-per-pass", "12", "--static", "--hooks-ab", "2",
                                 "--json"), DRY_BOX),
            Part("step_overhead", (py, "bench/step_overhead.py", "--model", "tiny-qwen2",
                                   "--dtype", "bfloat16", "--lora-dropout", "0.05",
                                   "--prompts", "2", "--group", "2", "--max-len", "6",
                                   "--repeats", "1", "--device", "cpu", "--json"), DRY_BOX),
            Part("isolation", (py, "bench/isolation.py", "--arch", "tiny", "--device", "cpu",
                               "--dtypes", "bfloat16,float32", "--modes", "isolated",
                               "--gradients", "--prompts", "2", "--group", "2", "--cap", "4",
                               "--threads", "1", "--json"), DRY_BOX),
            Part("cuda_tests", pytest, DRY_BOX, kind="junit"),
        ]
    return [
        Part("paper_round", (py, "bench/gpu_round.py", "--rollout-rows", "1024", "--static",
                             "--hooks-ab", "16", "--json"), 250),
        Part("step_overhead", (py, "bench/step_overhead.py", "--model", "qwen2.5-1.5b",
                               "--dtype", "bfloat16", "--lora-dropout", "0.05", "--prompts", "8",
                               "--group", "8", "--max-len", "128", "--repeats", "5", "--json"),
             100),
        Part("isolation", (py, "bench/isolation.py", "--arch", "qwen2.5-1.5b", "--device", "cuda",
                           "--dtypes", "bfloat16,float32", "--modes", "batched,isolated",
                           "--gradients", "--prompts", "4", "--group", "4", "--cap", "32",
                           "--json"), 100),
        Part("cuda_tests", pytest, 75, kind="junit"),
    ]


def environment() -> dict[str, Any]:
    """Versions of what the parts import, the missing ones, and the device."""
    from importlib import metadata, util

    versions, missing = {}, []
    for name in MODULES:                      # found without importing (imports cost seconds)
        if util.find_spec(name) is None:
            missing.append(name)
            continue
        try:
            versions[name] = metadata.version(DISTRIBUTIONS.get(name, name))
        except metadata.PackageNotFoundError:
            versions[name] = "?"
    env: dict[str, Any] = {"python": sys.version.split()[0], "versions": versions,
                           "missing": missing}
    if "torch" in versions:
        import torch

        env["cuda"] = torch.cuda.is_available()
        if env["cuda"]:
            env.update(device_name=torch.cuda.get_device_name(), cuda_version=torch.version.cuda,
                       memory_total_bytes=torch.cuda.get_device_properties(0).total_memory)
    return env


def _last_json(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _junit(path: Path) -> dict[str, Any]:
    """Counts and the failing tests' names and messages from pytest's JUnit XML."""
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in suite.iter("testcase"):
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                               "message": (node.get("message") or "")[:400]})
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {**counts, "failed": failed}


def run_part(part: Part, timeout: float, out: Path) -> dict[str, Any]:
    """Run ``part`` in a new process group; kill the whole group at ``timeout``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), str(BENCH), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
        CUBLAS_WORKSPACE_CONFIG=":4096:8")   # lets isolation's deterministic check run
    record: dict[str, Any] = {"command": " ".join(part.argv), "budget_s": part.budget_s,
                              "timeout_s": round(timeout, 1)}
    if part.kind == "junit":
        (out / "cuda_tests.xml").unlink(missing_ok=True)       # never read a previous run's
    t0 = time.perf_counter()
    proc = subprocess.Popen(part.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    record["seconds"] = round(time.perf_counter() - t0, 2)
    (out / f"{part.name}.log").write_text(f"$ {record['command']}\n--- stdout\n{stdout}\n"
                                          f"--- stderr\n{stderr}")
    partial = [_last_json(line) for line in stderr.splitlines() if line.startswith('{"phase"')]
    partial = [p for p in partial if p is not None]          # a line cut by the kill is dropped
    if partial:
        record["phases_seen"] = partial         # gpu_round's running figures survive a timeout
    if part.kind == "junit" and (out / "cuda_tests.xml").exists() and not timed_out:
        record["result"] = _junit(out / "cuda_tests.xml")
    elif part.kind == "json":
        record["result"] = _last_json(stdout)
    failed = proc.returncode != 0 and not (part.kind == "junit" and "result" in record)
    record["status"] = "timeout" if timed_out else "failed" if failed or record.get(
        "result") is None else "ok"
    if record["status"] != "ok" or proc.returncode != 0:
        record["returncode"] = proc.returncode
        record["error"] = (stderr or stdout)[-3000:]
    return record


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 29's targets, each None when its part produced no figure."""
    def result(name: str) -> dict[str, Any]:
        return (results.get(name) or {}).get("result") or {}

    rnd, ovh, iso, tests = (result(n) for n in
                            ("paper_round", "step_overhead", "isolation", "cuda_tests"))
    peak = max((p["allocated_bytes"] for name, p in rnd.get("peak_memory", {}).items()
                if "allocated_bytes" in p and name != "hooks_ab"), default=None)  # CUDA only
    seconds = rnd.get("round_seconds")
    grads = [iso[d]["gradients"] for d in ("bfloat16", "float32") if "gradients" in iso.get(d, {})]
    rollouts = [iso[d]["isolated"] for d in ("bfloat16", "float32") if "isolated" in iso.get(d, {})]
    return {
        "round_seconds": seconds,
        "round_le_120_s": None if seconds is None else seconds <= 120,
        "round_le_90_s": None if seconds is None else seconds <= 90,
        "per_prompt_grads_seconds": rnd.get("seconds", {}).get("per_prompt_grads"),
        "prompt_sharing": rnd.get("prompt_sharing"),
        "hooks_speedup": rnd.get("hooks_ab", {}).get("speedup"),
        "peak_allocated_gb": None if peak is None else round(peak / GB, 2),
        "peak_le_80_gb": None if peak is None else peak <= 80 * GB,
        "fast_time_ratio": ovh.get("fast_time_ratio"),
        "fast_time_le_1_10": (None if "fast_time_ratio" not in ovh
                              else ovh["fast_time_ratio"] <= 1.10),
        "fast_memory_ratio": ovh.get("fast_memory_ratio"),
        "fast_memory_le_1_2": (None if "fast_memory_ratio" not in ovh
                               else ovh["fast_memory_ratio"] <= 1.2),
        "gradients_bit_identical": (all(g["bit_identical"] for g in grads) if len(grads) == 2
                                    else None),
        "gradients_repeatable": (all(g[m]["repeat_max_abs_change"] == 0.0 for g in grads
                                     for m in ("fast", "reference")) if len(grads) == 2 else None),
        "gradients_bit_identical_deterministic": (
            all(iso[d].get("gradients_deterministic", {}).get("bit_identical", False)
                for d in ("bfloat16", "float32")) if len(grads) == 2 else None),
        "isolated_rollouts_identical": (all(r["identical_fraction"] == 1.0 for r in rollouts)
                                        if len(rollouts) == 2 else None),
        "cuda_tests_passed": (None if not tests else
                              tests["failures"] + tests["errors"] == 0 and tests["passed"] > 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="every shape shrunk, on the CPU: checks the suite, not the device")
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="folder for gpu_suite.json and the parts' logs (default $OUT)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="the whole suite's wall-clock limit (default 540 s, 9 minutes; "
                             "a dry run's default is 4 x its parts' box)")
    parser.add_argument("--only", action="append", default=None, help="run only these parts")
    args = parser.parse_args(argv)
    if args.deadline_s is None:
        args.deadline_s = 4 * DRY_BOX if args.dry_run else 540.0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, Any] = {"suite": "bench/gpu_suite.py", "dry_run": args.dry_run,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "environment": environment(), "parts": {}}
    path = out / "gpu_suite.json"

    def save() -> None:
        report["goals"] = goals(report["parts"])
        report["seconds"] = round(time.perf_counter() - start, 1)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(path)

    for part in parts(args.dry_run, out):
        if args.only and part.name not in args.only:
            continue
        left = args.deadline_s - (time.perf_counter() - start)
        if left < 15:
            report["parts"][part.name] = {"status": "skipped", "error": "out of suite time"}
        else:
            report["parts"][part.name] = run_part(part, min(part.budget_s, left), out)
        print(json.dumps({"part": part.name, "status": report["parts"][part.name]["status"],
                          "seconds": report["parts"][part.name].get("seconds")}), flush=True)
        save()
    save()
    print(json.dumps({"wrote": str(path), "seconds": report["seconds"], "goals": report["goals"]}))
    return 0 if all(p["status"] == "ok" for p in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
