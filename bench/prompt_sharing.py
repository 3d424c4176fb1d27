"""One prompt's pass shared by its G completions: reference log-probs and per-prompt gradients.

A round scores every completion twice besides sampling it: the reference log-probs (Eq. 3's
pi_ref, adapter off, no grad) and the per-prompt gradient pass (Eq. 7). Rows of one prompt are
``[prompt][completion]``; run whole, each of the G rows repeats the prompt. With
``group_size`` (:func:`dpgrpo.objectives.logprobs.token_logprobs`) the prompt runs once and the
G completions extend its key/value cache, as decoding does; backward reaches the prompt's pass
through the cache.

This script times both passes on the same batch with sharing on and off (off: every row run
whole, the code before sharing), on a run config's model and adapter (default
``configs/cpu-study.toml``: SmolLM2-135M, rank 1 on the top six layers), with prompts of the
config's task and random completions of lengths in [cap/2, cap]. It prints wall and process CPU
seconds (medians of ``--repeats``, interleaved), the peak bytes allocated during one pass
(profiler allocator events on CPU, ``max_memory_allocated`` on CUDA), the process's peak RSS,
and the largest difference between the two paths' log-probs and gradients.

    .venv/bin/python bench/prompt_sharing.py [--config configs/cpu-study.toml] [--prompts 8]
        [--repeats 3] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpgrpo.objectives.logprobs as logprobs
from dpgrpo.config import load_config
from dpgrpo.model import LoraSettings, load_policy
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.tasks import get_task, load_problems
from dpgrpo.training.grads import per_prompt_grads
from step_overhead import peak_bytes, sync, synthetic_rollouts


@contextmanager
def sharing(on: bool):
    """Sharing off: no rows count as one prompt's, so every row runs whole."""
    original = logprobs.shared_prompt_end
    if not on:
        logprobs.shared_prompt_end = lambda *args: 0
    try:
        yield
    finally:
        logprobs.shared_prompt_end = original


def timed(fn: Callable[[], Any], device: str) -> tuple[float, float, Any]:
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/cpu-study.toml")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    m, train = config.model, config.train
    device = "cuda" if m.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    policy = load_policy(m.name, lora=LoraSettings.from_config(m), dtype=m.dtype, device=device)
    model, tok = policy.model.eval(), policy.tokenizer   # LoRA dropout off: paths comparable
    with torch.no_grad():               # a nonzero adapter, so the KL term has a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02, generator=torch.Generator(device=p.device).manual_seed(1))
    task = get_task(config.data.task)
    cap = train.max_new_tokens or task.default_max_new_tokens
    problems = load_problems(task, "train", config.data.data_dir)[:args.prompts]
    ro = synthetic_rollouts(tok, len(problems), train.group_size, cap,
                            messages=[task.prompt(p) for p in problems])
    rows = train.pass_rows(cap)
    method = "reference" if m.lora_layers is not None or m.gradient_checkpointing else "fast"
    rewards = torch.rand((ro.num_prompts, ro.group_size),
                         generator=torch.Generator().manual_seed(2)).round()
    obj = GRPOObjective(beta=train.beta)

    plain = build_grpo_batch(ro, rewards, group_advantages(rewards)).to(device)

    def ref_pass() -> torch.Tensor:
        return reference_logprobs(model, plain, batch_size=rows)

    with sharing(False):
        batch = replace(plain, ref_logprobs=ref_pass())

    def grad_pass() -> dict[str, torch.Tensor]:
        return per_prompt_grads(model, obj, batch, method=method, rows_per_pass=rows)

    passes = {"reference log-probs": ref_pass, "per-prompt gradients": grad_pass}
    results: dict[str, Any] = {}
    outputs: dict[tuple[str, bool], Any] = {}
    times: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for on in (True, False):
            for name, fn in passes.items():
                with sharing(on):
                    wall, cpu, out = timed(fn, device)
                times.setdefault((name, on), []).append((wall, cpu))
                outputs[(name, on)] = out
    for name, fn in passes.items():
        row: dict[str, Any] = {}
        for on in (True, False):
            with sharing(on):
                peak = peak_bytes(fn, device)
            walls, cpus = zip(*times[(name, on)])
            row["shared" if on else "whole rows"] = {
                "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                "peak_bytes": peak}
        a, b = outputs[(name, True)], outputs[(name, False)]
        if isinstance(a, dict):
            scale = max(float(v.abs().max()) for v in b.values())
            row["max_relative_difference"] = max(float((a[k] - b[k]).abs().max())
                                                 for k in a) / scale
        else:
            row["max_abs_difference"] = float((a - b).abs().max())
        row["speed_up_wall"] = row["whole rows"]["wall_s"] / row["shared"]["wall_s"]
        row["memory_ratio"] = row["shared"]["peak_bytes"] / max(1, row["whole rows"]["peak_bytes"])
        results[name] = row
    out = {"config": args.config, "model": m.name, "device": device, "threads": args.threads,
           "prompts": ro.num_prompts, "group_size": ro.group_size, "cap": cap,
           "row_width": int(ro.input_ids.shape[1]),
           "prompt_columns": int(ro.completion_mask.bool().any(0).long().argmax()),
           "grad_method": method, "rows_per_pass": rows, "passes": results,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, row in results.items():
        print(f"{name}: shared {row['shared']['wall_s']:.2f} s, whole rows "
              f"{row['whole rows']['wall_s']:.2f} s ({row['speed_up_wall']:.2f}x); peak "
              f"{row['shared']['peak_bytes'] / 2**20:.0f} vs "
              f"{row['whole rows']['peak_bytes'] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
