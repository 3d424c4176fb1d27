"""The frozen layers below the adapter computed once (dpgrpo.objectives.trunk), on and off.

Runs short seeded ``dpgrpo train`` runs of the CPU study's settings (SmolLM2-135M, LoRA on the
last 6 of 30 layers) with ``train.share_frozen_layers`` and ``train.frozen_layer_cache_mb`` on
and off, taking turns, and prints JSON: seconds per round and per phase (the runs' public
timings), each run's peak RSS, and the largest difference between the two released adapters
(0.0: the same bits). Two workloads:

* ``dp-grpo``: the study's DP-GRPO arm (8 prompts expected x G 6, cap 48): the reference pass
  keeps the trunk, the gradient pass replays it;
* ``leaky``: the study's leaky gold-SFT run (all 32 members every round, rank 4 on 7 modules):
  each record's trunk kept across rounds;
* ``warm-start``: the study's public warm start (gold SFT, 16 of 256 GSM8K problems expected
  per round; ``--workloads warm-start --rounds 30`` is the whole run).

    .venv/bin/python bench/frozen_trunk.py --rounds 3 --json      # ~8 minutes on 2 cores

``--together`` runs each pair at once (one thread each), which halves the time and loads both
alike. The figures and the load they were taken under go in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cpu-study.toml"
LEAKY = ["train.arm=non-private-gold-sft", "privacy.noise_multiplier=none", "data.task=gsm8k",
         f"data.data_dir={ROOT.parent / 'shared' / 'data'}", "data.limit=32",
         "privacy.expected_batch=32", "train.learning_rate=5e-3", "model.lora_rank=4",
         "model.target_modules=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]
WARM = ["train.arm=non-private-gold-sft", "privacy.noise_multiplier=none", "data.task=gsm8k",
        f"data.data_dir={ROOT.parent / 'shared' / 'data'}", "data.limit=256",
        "privacy.expected_batch=16"]
WORKLOADS = {"dp-grpo": [], "leaky": LEAKY, "warm-start": WARM}
SETTINGS = {"on": ["train.share_frozen_layers=true", "train.frozen_layer_cache_mb=512"],
            "off": ["train.share_frozen_layers=false", "train.frozen_layer_cache_mb=0"]}
#: a child reports its own peak RSS (ru_maxrss of RUSAGE_CHILDREN is the max over all children)
CHILD = ("import resource, sys; from dpgrpo.cli import main; sys.argv = ['dpgrpo', *sys.argv[1:]]"
         "\ntry:\n    main()\nfinally:\n    print('@@rss', resource.getrusage("
         "resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)")


def _command(out: Path, rounds: int, sets: list[str]) -> list[str]:
    args = [sys.executable, "-c", CHILD, "train", str(CONFIG), "--rounds", str(rounds),
            "--seed", "1", "--metrics", "jsonl", "--out", str(out), "--json",
            "--set", "train.public_timings=true"]
    for item in sets:
        args += ["--set", item]
    return args


def _result(out: Path, proc: subprocess.CompletedProcess) -> dict:
    if proc.returncode:
        raise SystemExit(f"bench/frozen_trunk.py: a run failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rss = [int(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("@@rss")]
    phases = {k: [round(r[k], 2) for r in rows] for k in rows[0] if k.startswith("time/")}
    return {"seconds_per_round": phases.pop("time/round"), "phases": phases,
            "mean_seconds_per_round": round(statistics.fmean(
                r["time/round"] for r in rows), 2),
            "peak_rss_bytes": rss[-1] if rss else None}


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _adapter_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x = load_file(str(a / "release" / "adapter_model.safetensors"))
    y = load_file(str(b / "release" / "adapter_model.safetensors"))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def run(rounds: int, together: bool, workloads: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    report: dict = {"rounds": rounds, "together": together, "cpu_count": os.cpu_count(),
                    "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        for name in workloads:
            outs = {s: Path(tmp) / f"{name}-{s}" for s in SETTINGS}
            cmds = {s: _command(outs[s], rounds, WORKLOADS[name] + SETTINGS[s]) for s in SETTINGS}
            if together:
                procs = {s: subprocess.Popen(cmds[s], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, env=env)
                         for s in SETTINGS}
                done = {s: _finish(p) for s, p in procs.items()}
            else:
                done = {s: subprocess.run(cmds[s], capture_output=True, text=True, env=env)
                        for s in SETTINGS}
            entry = {s: _result(outs[s], done[s]) for s in SETTINGS}
            entry["speedup"] = round(entry["off"]["mean_seconds_per_round"]
                                     / entry["on"]["mean_seconds_per_round"], 3)
            entry["adapter_max_abs_difference"] = _adapter_difference(outs["on"], outs["off"])
            report[name] = entry
    report["parent_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--together", action="store_true",
                        help="run each on/off pair at once (one thread each)")
    parser.add_argument("--workloads", default="dp-grpo,leaky")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    report = run(args.rounds, args.together, args.workloads.split(","))
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
