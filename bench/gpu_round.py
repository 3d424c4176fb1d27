"""One full DP-GRPO round at the paper's MATH shape, timed phase by phase, with peak memory.

Rollouts (128 prompts x G 8, 1,024 new tokens forced to full length), the reference pass
(adapter off), per-prompt gradients (one prompt's rows per pass), the mechanism (clip, sum,
cryptographic fp64 noise, divide by q n) and the AdamW step, on the Qwen2.5-1.5B-Instruct
architecture. Without local weights (``--weights DIR``) the model is built from its published
configuration with random weights: no download, and the same shapes, so the same time and
memory. Rewards are random (a random-weight model has nothing to verify); the verifier's CPU
time is not part of these figures.

Prints one JSON object: seconds per phase, peak GPU memory per phase (``max_memory_allocated``
and ``max_memory_reserved``) or peak RSS on CPU, and the settings.

    python bench/gpu_round.py --json                          # the MATH preset's round, CUDA
    python bench/gpu_round.py --arch tiny --device cpu --prompts 2 --group 2 --cap 8 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: Qwen2.5-1.5B-Instruct's published config.json (architecture only; weights are random here)
QWEN25_15B = dict(vocab_size=151_936, hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  max_position_embeddings=32_768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, bos_token_id=151_643, eos_token_id=151_645,
                  hidden_act="silu", sliding_window=None, use_sliding_window=False)
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def build_model(arch: str, weights: str | None, dtype: torch.dtype, device: str) -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    if weights:
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype)
    else:
        config = Qwen2Config(**(QWEN25_15B if arch == "qwen2.5-1.5b" else TINY))
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).requires_grad_(False)


class Phases:
    """Wall time and peak memory of each named phase."""

    def __init__(self, device: str) -> None:
        self.device, self.seconds, self.peak = device, {}, {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
            self.peak[name] = {"allocated_bytes": torch.cuda.max_memory_allocated(),
                               "reserved_bytes": torch.cuda.max_memory_reserved()}
        else:
            import resource
            self.peak[name] = {"process_peak_rss_bytes":
                               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        self.seconds[name] = time.perf_counter() - t0
        print(json.dumps({"phase": name, "seconds": self.seconds[name], **self.peak[name]}),
              file=sys.stderr, flush=True)                  # partial figures survive a timeout
        return out


def rollouts(model: Any, prompts: int, group: int, cap: int, prompt_len: int, rows_per_call: int,
             temperature: float, vocab: int, eos: int, pad: int, device: str,
             synthetic: bool = False, engine: str = "dpgrpo", check_every: int | None = None,
             static: bool = False) -> Any:
    """G completions per prompt of exactly ``cap`` tokens (EOS suppressed), in row batches.

    ``engine``: ``dpgrpo`` (the transformers engine's decoder, :func:`dpgrpo.rollout.decode`,
    with per-row coins) or ``hf-generate`` (``model.generate``). ``synthetic`` draws the
    completion tokens at random instead of generating them: the later phases depend only on
    the shapes, so this times them without the generation's minutes.
    """
    from transformers import GenerationConfig

    from dpgrpo.rollout import RolloutBatch

    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(prompt_len // 2, prompt_len + 1, (prompts,), generator=gen)
    width = int(lengths.max())
    pids = torch.full((prompts, width), pad, dtype=torch.long)
    pmask = torch.zeros((prompts, width), dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        pids[i, width - n:] = torch.randint(3, min(vocab, 100_000), (n,), generator=gen)
        pmask[i, width - n:] = 1
    pids, pmask = pids.repeat_interleave(group, 0), pmask.repeat_interleave(group, 0)
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                              max_new_tokens=cap, min_new_tokens=cap, eos_token_id=eos,
                              pad_token_id=pad)
    model.eval()
    pieces = []
    if synthetic:
        pieces.append(torch.randint(3, min(vocab, 100_000), (pids.shape[0], cap), generator=gen))
    elif engine == "dpgrpo":
        pieces.append(_engine_rollouts(model, lengths, pids[::group], group, cap, rows_per_call,
                                       temperature, pad, check_every, static))
    with torch.no_grad():
        for s in range(0, 0 if synthetic or engine == "dpgrpo" else pids.shape[0],
                       rows_per_call):
            torch.manual_seed(s)
            out = model.generate(input_ids=pids[s:s + rows_per_call].to(device),
                                 attention_mask=pmask[s:s + rows_per_call].to(device),
                                 generation_config=config)
            pieces.append(out[:, width:].cpu())
    model.train()
    comp = torch.cat(pieces)                                                  # (N, cap)
    n = comp.shape[0]
    cmask = torch.ones_like(comp)
    return RolloutBatch([[""] * group] * prompts, torch.cat([pids, comp], 1),
                        torch.cat([pmask, cmask], 1),
                        torch.cat([torch.zeros_like(pmask), cmask], 1),
                        torch.full((n,), comp.shape[1]), torch.ones(n, dtype=torch.bool),
                        group, prompts)


def _engine_rollouts(model: Any, lengths: torch.Tensor, pids: torch.Tensor, group: int,
                     cap: int, rows_per_call: int, temperature: float, pad: int,
                     check_every: int | None, static: bool) -> torch.Tensor:
    """``(prompts * group, cap)`` tokens from dpgrpo's decoder, whole groups per call, no stop
    token (every row runs to the cap, as ``min_new_tokens`` forces for ``generate``)."""
    from dpgrpo.rollout.decode import decode
    from dpgrpo.rollout.sampling import SamplerSettings, row_coins

    width = pids.shape[1]
    prompts = [row[width - n:].tolist() for row, n in zip(pids, lengths.tolist())]
    coins = row_coins(list(range(len(prompts))), group, cap)
    per_call = max(1, rows_per_call // group)
    out = []
    with torch.inference_mode():
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start:start + per_call]
            rows = [i for i in range(len(chunk)) for _ in range(group)]
            sl = slice(start * group, (start + len(chunk)) * group)
            out.append(decode(model, chunk, rows, coins[sl],
                              sampler=SamplerSettings(temperature), max_new_tokens=cap, stop=[],
                              pad_id=pad, check_every=check_every, static=static).cpu())
    return torch.cat(out)


@contextlib.contextmanager
def previous_hooks() -> Iterator[None]:
    """The fast path's LoRA hooks as they were before issue 29, for an A/B in one process:
    dropout's 1/(1-p) applied to the full-width dropped input, and the hook rebuilding that
    input in fp32 (upcast, mask, scale: three full-width passes instead of two)."""
    import dpgrpo.training.lora_hooks as lora_hooks

    hooks, dropout_init = lora_hooks.LoraHooks._hook_a, lora_hooks._RecordingDropout.__init__

    def hook_a(self: Any, names: dict, slot: dict, scale: float) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled() or not output.requires_grad:
                return
            saved = {"x": slot.get("x"), "mask": slot.get("mask"), "target": self.target}
            dtype = module.weight.dtype

            def backward_hook(grad_out: torch.Tensor) -> None:
                x, mask = saved.pop("x"), saved.pop("mask")
                x = x.to(dtype)
                if mask is not None:
                    x = x * mask * scale
                self._accumulate(names, saved["target"], x, grad_out)

            output.register_hook(backward_hook)
        return hook

    def init(self: Any, p: float, record: Callable, scaled: bool = True) -> None:
        dropout_init(self, p, record, True)

    lora_hooks.LoraHooks._hook_a, lora_hooks._RecordingDropout.__init__ = hook_a, init
    try:
        yield
    finally:
        lora_hooks.LoraHooks._hook_a, lora_hooks._RecordingDropout.__init__ = hooks, dropout_init


def hooks_ab(model: Any, batch: Any, prompts: int, rows: int, device: str,
             repeats: int = 2) -> dict[str, Any]:
    """Per-prompt gradients of the first ``prompts`` prompts with the previous and the current
    hooks, alternating, same dropout masks (seconds each), and how far apart the two results
    are. Sets the adapter's B to small random values first (run it last)."""
    from dpgrpo.objectives.grpo import GRPOObjective
    from dpgrpo.training.grads import per_prompt_grads

    with torch.no_grad():          # B != 0, so that lora_A's gradients (what changed) are not 0
        gen = torch.Generator().manual_seed(5)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(1e-3 * torch.randn(p.shape, generator=gen))
    r = batch.rows_per_prompt
    sub = type(batch)(batch.input_ids[:prompts * r], batch.attention_mask[:prompts * r],
                      batch.loss_mask[:prompts * r], batch.row_weights[:prompts],
                      prompts, r, batch.advantages[:prompts], batch.ref_logprobs[:prompts * r])
    times: dict[str, list[float]] = {"previous": [], "current": []}
    out: dict[str, Any] = {}
    for i in range(repeats):
        for name in ("previous", "current") if i % 2 == 0 else ("current", "previous"):
            torch.manual_seed(7)        # the same dropout masks: the same per-prompt seeds
            with previous_hooks() if name == "previous" else contextlib.nullcontext():
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out[name] = per_prompt_grads(model, GRPOObjective(beta=0.04), sub,
                                             method="fast", rows_per_pass=rows,
                                             dropout_seeds=list(range(1, prompts + 1)))
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
    a, b = out["previous"], out["current"]
    rel = max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-30)) for k in a)
    return {"prompts": prompts, "seconds": times, "max_tensor_relative_difference": rel,
            "speedup": min(times["previous"]) / min(times["current"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["qwen2.5-1.5b", "tiny"], default="qwen2.5-1.5b")
    parser.add_argument("--weights", default=None, help="local HF directory (optional)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--cap", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=160)
    parser.add_argument("--rollout-rows", type=int, default=512)
    parser.add_argument("--max-tokens-per-pass", type=int, default=8192)
    parser.add_argument("--grad-method", default="fast", choices=["fast", "reference"])
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--sigma", type=float, default=0.4842404738068581)
    parser.add_argument("--clip", type=float, default=0.05536)
    parser.add_argument("--synthetic-rollouts", action="store_true",
                        help="random completion tokens instead of generation (times the rest)")
    parser.add_argument("--engine", default="dpgrpo", choices=["dpgrpo", "hf-generate"],
                        help="rollout decoder: dpgrpo's transformers engine or model.generate")
    parser.add_argument("--check-every", type=int, default=None,
                        help="decoder steps between reads of the live-row count")
    parser.add_argument("--no-grouped-attention", action="store_true",
                        help="decode with transformers' own sdpa path (repeat_kv)")
    parser.add_argument("--static", action="store_true",
                        help="constant-shape decoding steps replayed as a CUDA graph")
    parser.add_argument("--rollouts-only", action="store_true", help="stop after the rollouts")
    parser.add_argument("--hooks-ab", type=int, default=0, metavar="PROMPTS",
                        help="after the round, time the per-prompt gradients of this many "
                             "prompts with the previous and the current LoRA hooks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.no_grouped_attention:
        import contextlib

        import dpgrpo.rollout.decode as decode_module
        decode_module.grouped_decoding = lambda model: contextlib.nullcontext(False)

    from dpgrpo.config import TrainConfig
    from dpgrpo.model import LoraSettings, attach_lora, enable_gradient_checkpointing
    from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, reference_logprobs
    from dpgrpo.objectives.logprobs import shared_prompt_end
    from dpgrpo.privacy.mechanism import privatize
    from dpgrpo.privacy.noise import NoiseSource
    from dpgrpo.training.grads import per_prompt_grads

    dtype = getattr(torch, args.dtype)
    phases = Phases(args.device)
    base = phases.run("load", lambda: build_model(args.arch, args.weights, dtype, args.device))
    model = attach_lora(base, LoraSettings(rank=4, alpha=8, dropout=0.05)).train()
    if args.checkpointing:
        enable_gradient_checkpointing(model)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=3e-4)
    rows = TrainConfig(group_size=args.group, max_new_tokens=args.cap,
                       max_tokens_per_pass=args.max_tokens_per_pass).pass_rows(args.cap)
    cfg = base.config
    ro = phases.run("rollouts", lambda: rollouts(
        model, args.prompts, args.group, args.cap, args.prompt_len, args.rollout_rows, 0.7,
        cfg.vocab_size, int(cfg.eos_token_id), 0, args.device, args.synthetic_rollouts,
        args.engine, args.check_every, args.static))
    rollout_info = {"engine": args.engine, "check_every": args.check_every, "static": args.static,
                    "grouped_attention": not args.no_grouped_attention,
                    "rollout_ms_per_step": 1e3 * phases.seconds["rollouts"] / args.cap * min(
                        1.0, args.rollout_rows / (args.prompts * args.group))}
    if args.rollouts_only:
        print(json.dumps({**rollout_info, "rows": args.prompts * args.group, "cap": args.cap,
                          "rollout_rows_per_call": args.rollout_rows,
                          "seconds": phases.seconds, "peak_memory": phases.peak}))
        return
    rewards = torch.randint(0, 2, (args.prompts, args.group),
                            generator=torch.Generator().manual_seed(2)).float()
    ro_dev = phases.run("to_device", lambda: type(ro)(
        ro.texts, ro.input_ids.to(args.device), ro.attention_mask.to(args.device),
        ro.completion_mask.to(args.device), ro.completion_lengths, ro.hit_cap, ro.group_size,
        ro.num_prompts))
    ref = phases.run("reference_pass", lambda: reference_logprobs(model, ro_dev, batch_size=rows))
    batch = build_grpo_batch(ro_dev, rewards.to(args.device), ref_logprobs=ref)
    ids, attn, mask, _ = batch.window(slice(0, min(rows, args.group)))
    shared_end = shared_prompt_end(ids, attn, mask.bool(), min(rows, args.group))
    grads = phases.run("per_prompt_grads", lambda: per_prompt_grads(
        model, GRPOObjective(beta=0.04), batch, method=args.grad_method, rows_per_pass=rows))
    update = phases.run("mechanism", lambda: privatize(
        grads, clip_norm=args.clip, noise_multiplier=args.sigma,
        expected_batch=float(args.prompts), noise=NoiseSource()).update)

    def step() -> None:
        for name, p in params.items():
            p.grad = update[name].to(device=p.device, dtype=p.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)

    phases.run("adamw_step", step)
    train_phases = ("rollouts", "reference_pass", "per_prompt_grads", "mechanism", "adamw_step")
    result = {
        "arch": args.arch, "weights": "local" if args.weights else "random (from config)",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype, "torch": torch.__version__, "prompts": args.prompts,
        "group": args.group, "cap": args.cap, "rows": args.prompts * args.group,
        "row_length": int(ro.input_ids.shape[1]), "tokens": int(ro.attention_mask.sum()),
        "rollout_rows_per_call": args.rollout_rows, "rows_per_pass": rows,
        "grad_method": args.grad_method, "gradient_checkpointing": args.checkpointing,
        # the first pass's prompt runs once for its rows (0: every row ran whole)
        "prompt_sharing": bool(shared_end) and not args.checkpointing,
        "shared_prompt_columns": shared_end,
        "synthetic_rollouts": args.synthetic_rollouts, **rollout_info,
        "lora_params": sum(p.numel() for p in params.values()),
        "seconds": phases.seconds, "round_seconds": sum(phases.seconds[k] for k in train_phases),
        "peak_memory": phases.peak,
    }
    if args.hooks_ab:
        result["hooks_ab"] = phases.run("hooks_ab", lambda: hooks_ab(
            model, batch, min(args.hooks_ab, args.prompts), rows, args.device))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
