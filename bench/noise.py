"""Cost of one round's cryptographic noise for the paper's LoRA (Qwen2.5-1.5B, rank 4, 7
projections).

One round of :func:`dpgrpo.privacy.mechanism.add_gaussian_noise` draws N(0, sigma^2 C^2) for every
trainable coordinate: d = 4,616,192 in 392 tensors (28 layers x 7 projections x lora_A, lora_B).
Measured per round (median over ``--repeats``):

  * secure: a fresh 256-bit os.urandom key, ChaCha20 keystream, fp64 Box-Muller, the sum of 4
    draws per coordinate (dpgrpo's generator), as one vector split into the 392 tensors, as
    ``add_gaussian_noise`` draws it;
  * the same drawn tensor by tensor (392 calls);
  * baseline: torch's ``normal_`` in fp64 from a CPU generator (the previous, 32-bit-seeded design),

and the ratio of the first to the baseline (process CPU time; wall time printed too). The
mechanism's total cost also includes moving the fp64 noise to the GPU (37 MB per round).

    .venv/bin/python bench/noise.py [--repeats 5] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dpgrpo.privacy.mechanism import add_gaussian_noise
from dpgrpo.privacy.noise import NoiseSource

HIDDEN, MLP, KV, LAYERS, RANK = 1536, 8960, 256, 28, 4
PROJECTIONS = [(HIDDEN, HIDDEN), (HIDDEN, KV), (HIDDEN, KV), (HIDDEN, HIDDEN), (HIDDEN, MLP),
               (HIDDEN, MLP), (MLP, HIDDEN)]


def lora_shapes() -> list[tuple[int, int]]:
    """lora_A (r, in) and lora_B (out, r) of every projection of every layer."""
    return [s for _ in range(LAYERS) for i, o in PROJECTIONS for s in ((RANK, i), (o, RANK))]


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """Median (process CPU seconds, wall seconds) of one call; CPU time is what other jobs on a
    shared machine disturb least."""
    fn()  # warm-up
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = lora_shapes()
    d = sum(a * b for a, b in shapes)
    noise = NoiseSource()

    sums = {str(i): torch.zeros(shape, dtype=torch.float64) for i, shape in enumerate(shapes)}

    def secure_round() -> None:
        noise.start_round()
        add_gaussian_noise(sums, 1.0, 0.03, noise)

    def secure_per_tensor() -> None:
        noise.start_round()
        for shape in shapes:
            noise.normal(shape, 0.03)

    gen = torch.Generator()

    def torch_baseline() -> None:
        gen.manual_seed(int.from_bytes(__import__("os").urandom(8), "little"))
        for shape in shapes:
            torch.empty(shape, dtype=torch.float64).normal_(0.0, 0.03, generator=gen)

    (secure, secure_wall), (per_tensor, _) = (_median_time(f, args.repeats)
                                              for f in (secure_round, secure_per_tensor))
    base, base_wall = _median_time(torch_baseline, args.repeats)
    out = {"coordinates": d, "tensors": len(shapes), "threads": args.threads,
           "secure_round_cpu_s": secure, "secure_round_wall_s": secure_wall,
           "secure_tensor_by_tensor_cpu_s": per_tensor, "torch_normal_fp64_cpu_s": base,
           "torch_normal_fp64_wall_s": base_wall, "ratio_secure_vs_torch_cpu": secure / base,
           "secure_million_coordinates_per_cpu_s": d / secure / 1e6}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key:34s} {value:.4g}" if isinstance(value, float) else f"{key:34s} {value}")


if __name__ == "__main__":
    main()
