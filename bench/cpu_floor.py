"""The matrix-multiply floor of a rollout call on this CPU: how fast could any engine be?

A decoding step of a dense transformer is its linear layers (the seven projections of every
layer and the vocabulary head) plus attention, norms and sampling. This script times only the
linear layers, with the model's own weight shapes, at the row counts a rollout call uses, with
``torch.nn.functional.linear`` in fp32 on ``--threads`` threads: the time of those matrix
products is a floor under any fp32 engine on this machine and this BLAS. It then prices the
``batched`` workload of ``bench/rollout.py`` (8 prompts x G 6, cap 48, 48 rows per call):

* ``loop_floor_s``: the previous loop (``model.generate``) prefills every row, G copies of each
  prompt, then decodes 48 rows per step;
* ``engine_floor_s``: the engine prefills each prompt once, then decodes the same steps;
* ``best_speedup``: measured loop time (``--loop-seconds``; default: bench/README.md's median)
  over ``engine_floor_s``, the most any fp32 engine could gain over the measured loop here.

    .venv/bin/python bench/cpu_floor.py --json

Prints one JSON object; weights are random (only shapes matter), the model is SmolLM2-135M's
configuration from transformers' Llama classes, so no download.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

import torch

#: SmolLM2-135M's shapes (hidden, intermediate, heads x head_dim, kv heads x head_dim, vocab).
HIDDEN, INTERMEDIATE, Q_WIDTH, KV_WIDTH, VOCAB, LAYERS = 576, 1536, 576, 192, 49152, 30


def layer_shapes() -> Counter:
    """(out, in) of each linear layer of one step, with multiplicity (head included)."""
    per_layer = [(Q_WIDTH, HIDDEN), (KV_WIDTH, HIDDEN), (KV_WIDTH, HIDDEN), (HIDDEN, Q_WIDTH),
                 (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    shapes: Counter = Counter()
    for shape in per_layer:
        shapes[shape] += LAYERS
    shapes[(VOCAB, HIDDEN)] += 1
    return shapes


def linear_seconds(rows: int, shapes: Counter, repeats: int, head_rows: int | None = None
                   ) -> float:
    """Median seconds of one pass through all the step's linear layers for ``rows`` input rows
    (the head sees ``head_rows``, e.g. only the last position of a prefill). Every layer has its
    own weight, as in the model, so the weights stream from memory as they do in a real step
    (one reused weight would stay in cache and overstate the rate)."""
    weights = [torch.randn(out, inp) for (out, inp), count in shapes.items()
               for _ in range(count)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    head = torch.randn(head_rows if head_rows is not None else rows, HIDDEN)

    def one_pass() -> None:
        for w in weights:
            x = head if w.shape[0] == VOCAB else inputs[w.shape[1]]
            torch.nn.functional.linear(x, w)

    one_pass()                                                 # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--cap", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=95,
                        help="mean prompt length with the chat template (arithmetic task)")
    parser.add_argument("--loop-seconds", type=float, default=33.1,
                        help="measured loop wall time of the workload (bench/README.md)")
    parser.add_argument("--engine-seconds", type=float, default=21.3,
                        help="measured engine wall time of the workload (bench/README.md)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = layer_shapes()
    rows = args.prompts * args.group
    flops_per_row = 2 * sum(o * i * c for (o, i), c in shapes.items())
    step = linear_seconds(rows, shapes, args.repeats)
    prefill_engine = linear_seconds(args.prompts * args.prompt_tokens, shapes, args.repeats,
                                    head_rows=args.prompts)
    prefill_loop = linear_seconds(rows * args.prompt_tokens, shapes, args.repeats,
                                  head_rows=rows)
    decode = (args.cap - 1) * step
    engine_floor, loop_floor = prefill_engine + decode, prefill_loop + decode
    out = {
        "threads": args.threads, "rows": rows, "cap": args.cap,
        "decode_step_linear_s": step,
        "decode_step_gflops": flops_per_row * rows / step / 1e9,
        "prefill_linear_s": {"engine": prefill_engine, "loop": prefill_loop},
        "engine_floor_s": engine_floor, "loop_floor_s": loop_floor,
        "measured_s": {"loop": args.loop_seconds, "engine": args.engine_seconds},
        "engine_over_floor": args.engine_seconds / engine_floor,
        "best_speedup": args.loop_seconds / engine_floor,
        "measured_speedup": args.loop_seconds / args.engine_seconds,
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
