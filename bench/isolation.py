"""Do a prompt's rollouts depend on its batch-mates? Batched against isolated generation.

Same prompts, same per-prompt seeds, generated twice: alone, and interleaved with other (longer)
prompts. Reports the fraction of the shared prompts' completions that come out token-identical
in each mode, and the speed of each mode (completion tokens per second) on the larger set.
Batched mode shares padded ``generate`` calls across prompts (the paper's setting, A2's gap);
isolated mode (``train.rollout_isolation = "isolated"``) gives each prompt its own unpadded call.

    .venv/bin/python bench/isolation.py --json [--model smollm2-135m] [--prompts 6] [--group 4]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--cap", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from dpgrpo.model import load_base_model, load_tokenizer
    from dpgrpo.rollout import generate
    from dpgrpo.tasks import get_task, load_problems

    tok, model = load_tokenizer(args.model), load_base_model(args.model, "float32", "cpu")
    task = get_task("arithmetic")
    problems = load_problems(task, "train")
    shared = [task.prompt(p) for p in problems[:args.prompts]]
    others = [task.prompt(p) + " Explain every step in detail." for p in
              problems[args.prompts:2 * args.prompts]]
    seeds = [1000 + i for i in range(args.prompts)]
    other_seeds = [2000 + i for i in range(args.prompts)]
    mixed = [m for pair in zip(shared, others) for m in pair]
    mixed_seeds = [s for pair in zip(seeds, other_seeds) for s in pair]
    kw = dict(group_size=args.group, temperature=0.7, max_new_tokens=args.cap)
    result: dict = {"model": args.model, "prompts": args.prompts, "group": args.group,
                    "cap": args.cap, "threads": args.threads}
    for mode in ("batched", "isolated"):
        iso = mode == "isolated"
        alone = generate(model, tok, shared, seeds=seeds, isolated=iso, **kw)
        t0 = time.perf_counter()
        crowd = generate(model, tok, mixed, seeds=mixed_seeds, isolated=iso, **kw)
        seconds = time.perf_counter() - t0
        same = sum(a == b for i in range(args.prompts)
                   for a, b in zip(alone.texts[i], crowd.texts[2 * i]))
        tokens = int(crowd.completion_lengths.sum())
        result[mode] = {"identical_fraction": same / (args.prompts * args.group),
                        "seconds": seconds, "completion_tokens": tokens,
                        "tokens_per_second": tokens / seconds}
    result["isolated_slowdown"] = (result["batched"]["tokens_per_second"]
                                   / result["isolated"]["tokens_per_second"])
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
