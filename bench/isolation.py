"""Do a prompt's rollouts and per-prompt gradient depend on its batch-mates?

Rollouts: the same prompts, with the same per-prompt seeds, generated twice: alone, and
interleaved with other (longer) prompts. Reports the fraction of the shared prompts'
completions that come out token-identical in each mode, and the speed of each mode
(completion tokens per second) on the larger set. Batched mode shares padded calls across
prompts (the paper's setting, A2's gap); isolated mode (``train.rollout_isolation =
"isolated"``) gives each prompt its own unpadded call, so its completions must be identical.

Gradients (``--gradients``): each prompt's per-prompt LoRA gradient (fast and reference paths)
and its reference log-probs, computed alone and with a much longer prompt added to the round
(wider rows, more padding), as ``dpgrpo verify``'s ``batchmate_isolation`` does; the largest
change must be 0 (LoRA dropout off, see ``_one_dtype``). The alone run is repeated, so a
difference caused by the device's run-to-run nondeterminism is told apart from one caused by
the batch-mates; a second check runs with ``torch.use_deterministic_algorithms(True)`` (on
CUDA set ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, as ``bench/gpu_suite.py`` does).

``--arch`` builds a random-weight model from ``bench/gpu_round.py``'s configurations with the
tiny offline tokenizer's vocabulary (no download), so this runs on a bare GPU image:

    .venv/bin/python bench/isolation.py --json [--model smollm2-135m] [--prompts 6] [--group 4]
    python bench/isolation.py --arch qwen2.5-1.5b --device cuda --dtypes bfloat16,float32 \\
        --gradients --modes isolated --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

EXTRA = " Explain every step in detail."


def rollout_identity(model: Any, tok: Any, shared: list[str], others: list[str], *,
                     group: int, cap: int, modes: tuple[str, ...] = ("batched", "isolated")
                     ) -> dict[str, Any]:
    """Per mode: the fraction of ``shared``'s completions that are token-identical alone and
    interleaved with ``others``, and the crowded call's completion tokens per second."""
    from dpgrpo.rollout import generate

    n = len(shared)
    seeds, other_seeds = [1000 + i for i in range(n)], [2000 + i for i in range(n)]
    mixed = [m for pair in zip(shared, others) for m in pair]
    mixed_seeds = [s for pair in zip(seeds, other_seeds) for s in pair]
    kw = dict(group_size=group, temperature=0.7, max_new_tokens=cap)
    result: dict[str, Any] = {}
    for mode in modes:
        iso = mode == "isolated"
        alone = generate(model, tok, shared, seeds=seeds, isolated=iso, **kw)
        t0 = time.perf_counter()
        crowd = generate(model, tok, mixed, seeds=mixed_seeds, isolated=iso, **kw)
        seconds = time.perf_counter() - t0
        rows = [(alone.input_ids[i * group + r][alone.completion_mask[i * group + r].bool()],
                 crowd.input_ids[2 * i * group + r][crowd.completion_mask[2 * i * group + r]
                                                    .bool()])
                for i in range(n) for r in range(group)]
        same = sum(bool(torch.equal(a, b)) for a, b in rows)
        tokens = int(crowd.completion_lengths.sum())
        result[mode] = {"identical_fraction": same / (n * group), "identical": same,
                        "completions": n * group, "seconds": seconds,
                        "completion_tokens": tokens, "tokens_per_second": tokens / seconds}
    return result


def _moved(rollouts: Any, device: str) -> Any:
    return dataclasses.replace(rollouts, **{
        f.name: getattr(rollouts, f.name).to(device) for f in dataclasses.fields(rollouts)
        if isinstance(getattr(rollouts, f.name), torch.Tensor) and f.name != "completion_lengths"})


def gradient_identity(model: Any, tok: Any, device: str, rows_per_pass: int = 2
                      ) -> dict[str, Any]:
    """Largest change of any shared prompt's per-prompt gradient (fast and reference paths)
    and reference log-probs when a much longer prompt joins its round; and the same between
    two identical alone runs (the device's own run-to-run spread)."""
    from dpgrpo.objectives.grpo import (
        GRPOObjective,
        build_grpo_batch,
        group_advantages,
        reference_logprobs,
    )
    from dpgrpo.training.grads import per_prompt_grads
    from dpgrpo.verify.fixtures import random_specs, rollouts_from_specs

    specs, longer = random_specs(tok, 0, 3), random_specs(tok, 1, 1, long=True)
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    crowded = torch.cat([rewards[:1], torch.tensor([[0.0, 1.0, 1.0]]), rewards[1:]])

    def run(spec_list: list, rew: torch.Tensor, method: str) -> tuple[Any, dict]:
        rollouts = _moved(rollouts_from_specs(tok, spec_list), device)
        ref = reference_logprobs(model, rollouts, batch_size=rows_per_pass)
        rew = rew.to(device)
        batch = build_grpo_batch(rollouts, rew, group_advantages(rew), ref)
        return batch, per_prompt_grads(model, GRPOObjective(), batch, method=method,
                                       rows_per_pass=rows_per_pass)

    def worst(a_batch: Any, a: dict, b_batch: Any, b: dict, pairs: tuple) -> float:
        out = 0.0
        for i, j in pairs:
            out = max(out, max(float((a[k][i] - b[k][j]).abs().max()) for k in a))
            ra = a_batch.ref_logprobs[a_batch.prompt_rows(i)]
            rb = b_batch.ref_logprobs[b_batch.prompt_rows(j)]
            out = max(out, float((ra[ra != 0] - rb[rb != 0]).abs().max()))
        return out

    result: dict[str, Any] = {}
    for method in ("fast", "reference"):
        a_batch, a = run(specs, rewards, method)
        r_batch, r = run(specs, rewards, method)
        b_batch, b = run([specs[0], longer[0], specs[1], specs[2]], crowded, method)
        norm = float(sum(v[0].double().pow(2).sum() for v in a.values()) ** 0.5)
        result[method] = {
            "batchmates_max_abs_change": worst(a_batch, a, b_batch, b, ((0, 0), (1, 2), (2, 3))),
            "repeat_max_abs_change": worst(a_batch, a, r_batch, r, ((0, 0), (1, 1), (2, 2))),
            "rows_widened_by": int(b_batch.input_ids.shape[1] - a_batch.input_ids.shape[1]),
            "first_prompt_grad_norm": norm}
    result["bit_identical"] = all(result[m]["batchmates_max_abs_change"] == 0.0
                                  for m in ("fast", "reference"))
    return result


def random_policy(arch: str, dtype: str, device: str) -> tuple[Any, Any]:
    """A random-weight ``arch`` (``bench/gpu_round.py``) with the tiny tokenizer's vocabulary
    and the training adapter (rank 4, dropout 0.05; B nonzero so gradients reach A)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from transformers import AutoModelForCausalLM, Qwen2Config

    from dpgrpo.model import LoraSettings, attach_lora
    from dpgrpo.verify.fixtures import build_tiny_tokenizer
    from gpu_round import QWEN25_15B, TINY

    tok = build_tiny_tokenizer()
    spec = dict(QWEN25_15B if arch == "qwen2.5-1.5b" else TINY, vocab_size=len(tok),
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(Qwen2Config(**spec), dtype=getattr(torch, dtype))
    model = attach_lora(base.requires_grad_(False), LoraSettings(rank=4, alpha=8, dropout=0.05))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model.eval(), tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--arch", default=None, choices=["qwen2.5-1.5b", "tiny"],
                        help="random weights from a configuration instead of --model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="float32", help="comma-separated model dtypes")
    parser.add_argument("--modes", default="batched,isolated")
    parser.add_argument("--gradients", action="store_true", help="also check the gradients")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--cap", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"model": args.arch or args.model, "device": args.device,
                              "prompts": args.prompts, "group": args.group, "cap": args.cap,
                              "threads": args.threads, "torch": torch.__version__}
    for dtype in args.dtypes.split(","):
        try:
            result[dtype] = _one_dtype(args, dtype)
        except Exception as exc:  # one dtype's failure must not lose the other's
            result[dtype] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    if len(args.dtypes.split(",")) == 1 and not args.gradients:   # the earlier flat layout
        result.update(result.pop(args.dtypes))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


def _one_dtype(args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    """Rollout identity (and, with ``--gradients``, gradient identity) of one model dtype."""
    modes = tuple(m for m in args.modes.split(",") if m)
    if args.arch:
        from step_overhead import MESSAGES  # bench/ is on the path

        model, tok = random_policy(args.arch, dtype, args.device)
        texts = [MESSAGES[i % len(MESSAGES)] for i in range(2 * args.prompts)]
        shared, others = texts[:args.prompts], [t + EXTRA for t in texts[args.prompts:]]
    else:
        from dpgrpo.model import load_base_model, load_tokenizer
        from dpgrpo.tasks import get_task, load_problems

        tok = load_tokenizer(args.model)
        model = load_base_model(args.model, dtype, args.device)
        task = get_task("arithmetic")
        problems = load_problems(task, "train")
        shared = [task.prompt(p) for p in problems[:args.prompts]]
        others = [task.prompt(p) + EXTRA for p in problems[args.prompts:2 * args.prompts]]
    part: dict[str, Any] = rollout_identity(model, tok, shared, others, group=args.group,
                                            cap=args.cap, modes=modes)
    if "batched" in part and "isolated" in part:
        part["isolated_slowdown"] = (part["batched"]["tokens_per_second"]
                                     / part["isolated"]["tokens_per_second"])
    if args.gradients:
        # dropout off: with it on, a batch-mate shifts the masks' random stream, and the masks
        # become other draws from the same distribution (as batched rollouts do)
        part["gradients"] = gradient_identity(model.eval(), tok, args.device)
        # again with deterministic kernels: if the repeat above differs, the device's atomics
        # (attention backward) are the cause, and this says whether isolation holds without them
        torch.use_deterministic_algorithms(True)
        try:
            part["gradients_deterministic"] = gradient_identity(model, tok, args.device)
        except RuntimeError as exc:                 # an op without a deterministic kernel
            part["gradients_deterministic"] = {"error": str(exc)[:1000]}
        finally:
            torch.use_deterministic_algorithms(False)
    return part

if __name__ == "__main__":
    main()
