"""Cost of one DP-GRPO update against one non-private GRPO update, on the same batch.

Three full updates (rollouts, rewards and reference log-probs are fixed beforehand and not
timed, since all three need them equally):

  (i)   non-private: flat-mean GRPO loss (Eq. 7), ``loss.backward()``, AdamW step;
  (ii)  reference loop: one backward per prompt, then clip + sum + noise + divide by q*n
        (``dpgrpo.privacy.mechanism.privatize``), AdamW step;
  (iii) fast path: one backward with per-prompt LoRA hooks, same mechanism and step.

Times are medians over ``--repeats`` interleaved, rotated rounds (after one warm-up round that
also creates the AdamW state); on CPU the ratios use process CPU time by default, which other
jobs on a shared machine disturb far less than wall time (both are reported). Memory is the
peak of bytes allocated during one update above what was allocated before it:
``torch.cuda.max_memory_allocated`` on CUDA; on CPU the running sum of the profiler's allocator
events (``profile_memory=True``), which counts every torch tensor allocation and free exactly
(not sampled RSS).

    .venv/bin/python bench/step_overhead.py [--model tiny|smollm2-135m|qwen2.5-1.5b|PATH]
        [--dtype float32] [--lora-dropout 0.0] [--prompts 8] [--group 4] [--max-len 64]
        [--repeats 5] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dpgrpo.model import LoraSettings, attach_lora, load_base_model, load_tokenizer
from dpgrpo.objectives import TrainBatch
from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, reference_logprobs
from dpgrpo.privacy.mechanism import privatize
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.rollout import RolloutBatch
from dpgrpo.training.grads import per_prompt_grads_fast, per_prompt_grads_reference
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer

MESSAGES = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more. How many apples?",
            "Solve the problem step by step: 7 * 8 = ?", "Answer with a letter: A B C D E.",
            "What is 100 divided by 4?", "A train travels 60 km in 1 hour. How far in 3?",
            "Compute 2^10.", "What is the sum of the first five odd numbers?"]


#: architectures built from a configuration with random weights (no download), named as
#: ``bench/gpu_round.py`` names them; prompts come from the tiny tokenizer (ids < 512 fit both
#: vocabularies). ``tiny-qwen2`` is gpu_round's tiny Qwen2, for dry runs of the same code path.
RANDOM_ARCHS = {"qwen2.5-1.5b": "qwen2.5-1.5b", "tiny-qwen2": "tiny"}


def load(name: str, device: str, dtype: str = "float32",
         dropout: float = 0.0) -> tuple[torch.nn.Module, object]:
    if name == "tiny":
        tok = build_tiny_tokenizer()
        base = build_tiny_model(tok, hidden_size=64, dtype=dtype).to(device)
        base.requires_grad_(False)
    elif name in RANDOM_ARCHS:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_round import build_model

        tok = build_tiny_tokenizer()
        base = build_model(RANDOM_ARCHS[name], None, getattr(torch, dtype), device)
    else:
        tok, base = load_tokenizer(name), load_base_model(name, dtype, device)
    return attach_lora(base, LoraSettings(dropout=dropout)).train(), tok


def synthetic_rollouts(tok, prompts: int, group: int, max_len: int, seed: int = 0,
                       messages: list[str] = MESSAGES) -> RolloutBatch:
    """Chat-templated prompts (``messages``, cycled), left-padded; random completions of lengths
    in [max_len/2, max_len], EOS-terminated."""
    gen = torch.Generator().manual_seed(seed)
    texts = [tok.apply_chat_template([{"role": "user", "content": messages[i % len(messages)]}],
                                     tokenize=False, add_generation_prompt=True)
             for i in range(prompts)]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
    n = prompts * group
    lengths = torch.randint(max(max_len // 2, 1), max_len + 1, (n,), generator=gen)
    comp = torch.randint(3, min(len(tok), 30000), (n, max_len), generator=gen)
    comp[torch.arange(n), lengths - 1] = tok.eos_token_id
    cmask = (torch.arange(max_len)[None] < lengths[:, None]).long()
    comp = torch.where(cmask.bool(), comp, tok.pad_token_id)
    pids = enc["input_ids"].repeat_interleave(group, 0)
    pmask = enc["attention_mask"].repeat_interleave(group, 0)
    return RolloutBatch([[""] * group] * prompts, torch.cat([pids, comp], 1),
                        torch.cat([pmask, cmask], 1),
                        torch.cat([torch.zeros_like(pmask), cmask], 1), lengths,
                        torch.zeros(n, dtype=torch.bool), group, prompts)


def on_device(rollouts: RolloutBatch, device: str) -> RolloutBatch:
    """The rollouts' token tensors on ``device`` (the lengths stay on the CPU, as engines
    return them)."""
    return dataclasses.replace(rollouts, input_ids=rollouts.input_ids.to(device),
                               attention_mask=rollouts.attention_mask.to(device),
                               completion_mask=rollouts.completion_mask.to(device))


def make_steps(model, batch: TrainBatch, lr: float = 1e-5, clip: float = 0.05,
               sigma: float = 0.6) -> dict[str, Callable[[], None]]:
    obj = GRPOObjective(beta=0.04)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=lr)
    noise = NoiseSource(seed=0)
    expected = float(batch.num_prompts)  # q*n; any public constant costs the same

    def non_private() -> None:
        loss = obj.row_losses(model, batch, slice(0, batch.num_rows)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def private(grad_fn: Callable[..., dict]) -> Callable[[], None]:
        def step() -> None:
            grads = grad_fn(model, obj, batch)
            update = privatize(grads, clip_norm=clip, noise_multiplier=sigma,
                               expected_batch=expected, noise=noise).update
            for name, p in params.items():
                p.grad = update[name].to(p.dtype)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    return {"non-private": non_private, "reference loop": private(per_prompt_grads_reference),
            "fast path": private(per_prompt_grads_fast)}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_bytes(step: Callable[[], None], device: str) -> int:
    """Peak bytes allocated during ``step`` above the level before it."""
    if device.startswith("cuda"):
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        sync(device)
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny",
                        help="tiny, a model name or path, or a random-weight "
                             f"{tuple(RANDOM_ARCHS)}")
    parser.add_argument("--dtype", default="float32", help="base model dtype (LoRA stays fp32)")
    parser.add_argument("--lora-dropout", type=float, default=0.0,
                        help="LoRA dropout (the paper's 0.05 exercises the hooks' masks)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clock", choices=["process", "wall"], default=None,
                        help="ratios from process CPU time (default on CPU: robust to other "
                             "jobs on a shared machine) or wall time (default on CUDA)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.clock is None:
        args.clock = "wall" if args.device.startswith("cuda") else "process"

    model, tok = load(args.model, args.device, args.dtype, args.lora_dropout)
    rollouts = on_device(synthetic_rollouts(tok, args.prompts, args.group, args.max_len),
                         args.device)                  # the reference pass runs on the model's
    rewards = torch.randint(0, 2, (args.prompts, args.group),
                            generator=torch.Generator().manual_seed(1)).float()
    batch = build_grpo_batch(rollouts, rewards.to(args.device),
                             ref_logprobs=reference_logprobs(model, rollouts))
    batch = batch.to(args.device)
    steps = make_steps(model, batch)

    clock = time.process_time if args.clock == "process" else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in steps}
    walls: dict[str, list[float]] = {k: [] for k in steps}
    for step in steps.values():  # warm-up; creates the AdamW state
        step()
    names = list(steps)
    for r in range(args.repeats):
        # interleaved and rotated, so machine load and allocator state hit all alike
        for k in names[r % 3:] + names[:r % 3]:
            step = steps[k]
            sync(args.device)
            t0, w0 = clock(), time.perf_counter()
            step()
            sync(args.device)
            times[k].append(clock() - t0)
            walls[k].append(time.perf_counter() - w0)
    memory = {k: peak_bytes(step, args.device) for k, step in steps.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    med_wall = {k: statistics.median(v) for k, v in walls.items()}
    base_t, base_m = med["non-private"], memory["non-private"]
    result = {
        "model": args.model, "device": args.device, "threads": args.threads,
        "device_name": (torch.cuda.get_device_name() if args.device.startswith("cuda")
                        else "cpu"),
        "dtype": args.dtype, "lora_dropout": args.lora_dropout, "torch": torch.__version__,
        "prompts": args.prompts, "group": args.group, "max_len": args.max_len,
        "seq_len": int(batch.input_ids.shape[1]), "repeats": args.repeats,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "clock": args.clock, "time_s": med, "wall_s": med_wall, "peak_bytes": memory,
        "loop_time_ratio": med["reference loop"] / base_t,
        "fast_time_ratio": med["fast path"] / base_t,
        "loop_memory_ratio": memory["reference loop"] / base_m,
        "fast_memory_ratio": memory["fast path"] / base_m,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"model {args.model} on {args.device} ({args.threads} threads): B={args.prompts} "
          f"G={args.group} completion<={args.max_len} tokens, row length {result['seq_len']}, "
          f"{result['trainable_params']:,} LoRA parameters, median of {args.repeats}")
    print(f"{'update':16} {args.clock + ' s':>10} {'x non-private':>14} {'wall s':>9} "
          f"{'peak MiB':>10} {'x non-private':>14}")
    for k in steps:
        print(f"{k:16} {med[k]:10.4f} {med[k] / base_t:14.2f} {med_wall[k]:9.4f} "
              f"{memory[k] / 2**20:10.1f} {memory[k] / base_m:14.2f}")


if __name__ == "__main__":
    main()
