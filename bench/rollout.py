"""Rollout throughput: the transformers engine against the previous ``model.generate`` loop.

Same prompts (the embedded arithmetic task's first training problems), same seeds, same cap,
same rows per call, three workloads:

* ``batched``: training's rollouts, G completions at temperature 0.7, batched mode, rows per
  call from ``TrainConfig.rollout_rows`` (training's default);
* ``isolated``: the same in isolated mode (``train.rollout_isolation = "isolated"``);
* ``greedy``: evaluation's call, one greedy completion per prompt, 8 prompts per call.

Every measurement runs in a fresh process (model load excluded, one short warm-up call first),
engines alternating, ``--repeats`` times; the figures are medians of completion tokens per
second by wall time and by process CPU time, and the process's peak RSS (CPU) or peak
allocated GPU memory. The policy is the model with the training LoRA attached (rank 4 on the
seven projections, B = 0, so the same outputs as the base), as in training.

    .venv/bin/python bench/rollout.py --json                       # SmolLM2-135M, CPU
    python bench/rollout.py --arch qwen2.5-1.5b --device cuda --prompts 128 --group 8 \
        --cap 1024 --modes batched --repeats 1 --json              # random-weight Qwen2.5-1.5B

On the GPU, ``--arch qwen2.5-1.5b`` builds the model from its published configuration with
random weights (``bench/gpu_round.py``); prompts are tokenized with SmolLM2's tokenizer (ids
fit Qwen's vocabulary) and a random model almost never emits its stop token, so every row
runs to the cap: the worst case for a round. ``--arch tiny`` runs dpgrpo's tiny random Llama
(a smoke test of the script, seconds on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ENGINES = ("hf-generate", "engine")
MODES = ("batched", "isolated", "greedy")


def _settings(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from dpgrpo.config import TrainConfig

    if mode == "greedy":
        return dict(group_size=1, temperature=0.0, max_new_tokens=args.cap, batch_size=8,
                    isolated=False)
    rows = args.rows or TrainConfig(group_size=args.group, max_new_tokens=args.cap
                                    ).rollout_rows(args.cap)
    return dict(group_size=args.group, temperature=0.7, max_new_tokens=args.cap,
                batch_size=rows, isolated=mode == "isolated")


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from dpgrpo.model import LoraSettings, attach_lora, load_base_model, load_tokenizer

    if args.arch == "tiny":  # a smoke test of the script: dpgrpo's tiny random Llama
        from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        model = build_tiny_model(tok, dtype=args.dtype).to(args.device)
    elif args.arch == "smollm2-135m":
        tok = load_tokenizer("smollm2-135m")
        model = load_base_model(args.model, args.dtype, args.device)
    else:
        tok = load_tokenizer("smollm2-135m")
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_round import build_model

        model = build_model(args.arch, None, getattr(torch, args.dtype), args.device)
    if args.lora:
        torch.manual_seed(0)
        model = attach_lora(model, LoraSettings())
    return model, tok


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One timed generation in this process; prints its figures as one JSON line."""
    from dpgrpo.rollout import generate, hf_generate
    from dpgrpo.tasks import get_task, load_problems

    torch.set_num_threads(args.threads)
    model, tok = _load(args)
    task = get_task("arithmetic")
    messages = [task.prompt(p) for p in load_problems(task, "train")[:args.prompts]]
    fn = generate if args.worker == "engine" else hf_generate
    kw = _settings(args, args.mode)
    fn(model, tok, messages[:1], **(kw | dict(max_new_tokens=2)), seeds=[1])      # warm-up
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(model, tok, messages, seeds=list(range(1000, 1000 + len(messages))), **kw)
    if cuda:
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result = {"wall_s": wall, "cpu_s": cpu, "tokens": int(out.completion_lengths.sum()),
              "rows": out.num_rows, "cap_rate": float(out.hit_cap.float().mean()),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "rss_before_bytes": rss_before}
    if cuda:
        result["peak_gpu_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return result


def _run_worker(args: argparse.Namespace, engine: str, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", engine, "--mode", mode]
    for key in ("model", "arch", "device", "dtype", "prompts", "group", "cap", "threads",
                "rows"):
        value = getattr(args, key)
        if value is not None:
            cmd += [f"--{key}", str(value)]
    cmd += [] if args.lora else ["--no-lora"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker {engine}/{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "tokens")}
    out = {"runs": len(runs), "median_wall_s": med["wall_s"], "median_cpu_s": med["cpu_s"],
           "median_tokens": med["tokens"],
           "tokens_per_s_wall": statistics.median(r["tokens"] / r["wall_s"] for r in runs),
           "tokens_per_s_cpu": statistics.median(r["tokens"] / r["cpu_s"] for r in runs),
           "cap_rate": statistics.median(r["cap_rate"] for r in runs),
           "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
           "generation_rss_bytes": max(r["peak_rss_bytes"] - r["rss_before_bytes"]
                                       for r in runs)}
    if "peak_gpu_allocated_bytes" in runs[0]:
        out["peak_gpu_allocated_bytes"] = max(r["peak_gpu_allocated_bytes"] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--arch", default="smollm2-135m",
                        choices=["smollm2-135m", "qwen2.5-1.5b", "tiny"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--cap", type=int, default=48)
    parser.add_argument("--rows", type=int, default=None, help="rows per call (default: "
                        "training's rollout_rows)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-lora", dest="lora", action="store_false")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.worker:
        print(json.dumps(worker(args)))
        return

    result: dict[str, Any] = {
        "model": args.arch if args.arch != "smollm2-135m" else args.model,
        "weights": "random (from config)" if args.arch != "smollm2-135m" else "pretrained",
        "device": args.device, "dtype": args.dtype, "threads": args.threads,
        "torch": torch.__version__, "prompts": args.prompts, "group": args.group,
        "cap": args.cap, "lora": args.lora, "repeats": args.repeats, "modes": {}}
    for mode in args.modes.split(","):
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
        for rep in range(args.repeats):
            for engine in (ENGINES if rep % 2 == 0 else ENGINES[::-1]):
                runs[engine].append(_run_worker(args, engine, mode))
        summary = {e: _summary(r) for e, r in runs.items()}
        base, new = summary["hf-generate"], summary["engine"]
        result["modes"][mode] = {
            "settings": {k: v for k, v in _settings(args, mode).items()}, **summary,
            "speedup_tokens_per_s_wall": new["tokens_per_s_wall"] / base["tokens_per_s_wall"],
            "speedup_tokens_per_s_cpu": new["tokens_per_s_cpu"] / base["tokens_per_s_cpu"],
            "speedup_time_cpu": base["median_cpu_s"] / new["median_cpu_s"]}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
