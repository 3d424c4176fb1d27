"""Peak memory of one DP-GRPO update: set by the pass size, not by the batch or the vocabulary.

One update = reference log-probs (adapter off) + per-prompt gradients (fast path, one prompt's
rows per pass) + clip/sum/noise/divide (``privatize``) + AdamW step, on fixed rollouts whose
completions are forced to full length. Each case runs in a fresh process; a thread samples the
process's resident set (``/proc/self/statm``) every 2 ms during the update, so the figures are
absolute peak RSS (model, Python and torch included), with the RSS just before the update and
the wall time beside them.

Cases:
  (a) a tiny random Llama with Qwen2.5's 151,936-token vocabulary, 2 and 16 prompts x G 8 x
      256 completion tokens (``tiny_full_logits_bytes``: what the fp32 (N, L, V) logits alone
      would take at 16 prompts);
  (b) SmolLM2-135M-Instruct (fp32, CPU) at 8 prompts x G 8 x 128 completion tokens.

    .venv/bin/python bench/memory.py --json            # all cases, one JSON object
    .venv/bin/python bench/memory.py --case tiny --prompts 16 --json   # one case
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from dpgrpo.training.runtime import PeakRSS  # peak RSS, sampled every 2 ms

VOCAB = 151_936


def _rollouts(prompt_ids: list[list[int]], group: int, length: int, vocab: int, eos: int,
              pad: int, seed: int = 0):
    import torch

    from dpgrpo.rollout import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    b, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    pids = torch.full((b, width), pad, dtype=torch.long)
    pmask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        pids[i, width - len(p):] = torch.tensor(p)
        pmask[i, width - len(p):] = 1
    n = b * group
    comp = torch.randint(3, min(vocab, 30_000), (n, length), generator=gen)
    comp[comp == eos] = 3                                     # forced to full length
    cmask = torch.ones((n, length), dtype=torch.long)
    pids, pmask = pids.repeat_interleave(group, 0), pmask.repeat_interleave(group, 0)
    return RolloutBatch([[""] * group] * b, torch.cat([pids, comp], 1),
                        torch.cat([pmask, cmask], 1),
                        torch.cat([torch.zeros_like(pmask), cmask], 1),
                        torch.full((n,), length), torch.ones(n, dtype=torch.bool), group, b)


def _tiny(prompts: int, group: int, length: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    prompt_ids = [torch.randint(3, VOCAB, (int(torch.randint(16, 33, (1,), generator=gen)),),
                                generator=gen).tolist() for _ in range(prompts)]
    return base, _rollouts(prompt_ids, group, length, VOCAB, eos=1, pad=0)


def _smollm2(prompts: int, group: int, length: int):
    from dpgrpo.model import load_base_model, load_tokenizer
    from dpgrpo.tasks import get_task, load_problems

    tok = load_tokenizer("smollm2-135m")
    base = load_base_model("smollm2-135m", "float32", "cpu")
    task = get_task("arithmetic")
    texts = [tok.apply_chat_template([{"role": "user", "content": task.prompt(p)}],
                                     tokenize=False, add_generation_prompt=True)
             for p in load_problems(task, "train")[:prompts]]
    prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return base, _rollouts(prompt_ids, group, length, len(tok), int(tok.eos_token_id),
                           int(tok.pad_token_id))


def run_case(case: str, prompts: int, group: int, length: int, threads: int,
             max_tokens_per_pass: int, checkpointing: bool) -> dict:
    import torch

    from dpgrpo.config import TrainConfig
    from dpgrpo.model import LoraSettings, attach_lora, enable_gradient_checkpointing
    from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, reference_logprobs
    from dpgrpo.privacy.mechanism import privatize
    from dpgrpo.privacy.noise import NoiseSource
    from dpgrpo.training.grads import per_prompt_grads
    from dpgrpo.training.runtime import bound_heap_growth

    bound_heap_growth()             # as dpgrpo.training.trainer.train does
    torch.set_num_threads(threads)
    base, rollouts = (_tiny if case == "tiny" else _smollm2)(prompts, group, length)
    model = attach_lora(base, LoraSettings()).train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=1e-5)
    rows = TrainConfig(group_size=group, max_new_tokens=length,
                       max_tokens_per_pass=max_tokens_per_pass).pass_rows(length)
    rewards = torch.randint(0, 2, (prompts, group),
                            generator=torch.Generator().manual_seed(2)).float()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        ref = reference_logprobs(model, rollouts, batch_size=rows)
        batch = build_grpo_batch(rollouts, rewards, ref_logprobs=ref)
        method = "reference" if checkpointing else "fast"     # train.grad_method = "auto"
        grads = per_prompt_grads(model, GRPOObjective(beta=0.04), batch, method=method,
                                 rows_per_pass=rows)
        update = privatize(grads, clip_norm=0.055, noise_multiplier=0.5,
                           expected_batch=float(prompts), noise=NoiseSource()).update
        for name, p in params.items():
            p.grad = update[name].to(p.dtype)
        opt.step()
        wall = time.perf_counter() - t0
    tokens = int(rollouts.attention_mask.sum())
    return {"case": case, "prompts": prompts, "group": group, "completion_tokens": length,
            "rows": prompts * group, "row_length": int(rollouts.input_ids.shape[1]),
            "tokens": tokens, "rows_per_pass": rows, "gradient_checkpointing": checkpointing,
            "peak_rss_bytes": mem.peak, "rss_before_bytes": mem.before,
            "update_rss_increase_bytes": mem.peak - mem.before, "wall_s": wall,
            "lora_params": sum(p.numel() for p in params.values())}


def _subprocess(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--json", *args], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["tiny", "smollm2"], default=None,
                        help="one case in this process (default: every case, each in its own)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens-per-pass", type=int, default=512)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.case is not None:
        length = args.length or (256 if args.case == "tiny" else 128)
        result = run_case(args.case, args.prompts, args.group, length, args.threads,
                          args.max_tokens_per_pass, args.checkpointing)
        print(json.dumps(result) if args.json else result)
        return
    common = ["--threads", str(args.threads), "--max-tokens-per-pass",
              str(args.max_tokens_per_pass)] + (["--checkpointing"] if args.checkpointing else [])
    small = _subprocess(["--case", "tiny", "--prompts", "2", *common])
    large = _subprocess(["--case", "tiny", "--prompts", "16", *common])
    smol = _subprocess(["--case", "smollm2", "--prompts", "8", *common])
    full_logits = large["rows"] * large["row_length"] * VOCAB * 4
    result = {
        "tiny_peak_small": small["peak_rss_bytes"], "tiny_peak_large": large["peak_rss_bytes"],
        "tiny_growth_ratio": large["peak_rss_bytes"] / small["peak_rss_bytes"],
        "tiny_full_logits_bytes": full_logits,
        "tiny_peak_large_fraction_of_full_logits": large["peak_rss_bytes"] / full_logits,
        "smollm2_update_peak_bytes": smol["peak_rss_bytes"], "smollm2_rows": smol["rows"],
        "cases": [small, large, smol],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
