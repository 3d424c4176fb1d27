"""Throughput of the sandboxed unit-test verifier of the code tasks (tests per second).

Each verification (:func:`dpgrpo.tasks.sandbox.run_tests`) starts a fresh ``python -I -S -B`` in
its own namespaces that answers the tests' calls; the verdict is computed in this process for
literal checks, in a second sandboxed process for the other tests (docs/code-sandbox.md).
Measured on the problems' canonical solutions (the gold targets: every test passes, the
slowest case) and on completions that fail at once (the bare prompt), with 1 and with
``--workers`` verifications in flight (threads: each waits on its own children), for
HumanEval (164 problems) and the embedded ``code`` task (200):

  tests per second = verified completions / wall seconds

with each row's wall time, the whole run's wall time and peak RSS (this process, sampled by
``dpgrpo.training.runtime.PeakRSS``; the largest sandbox child, from
``getrusage(RUSAGE_CHILDREN)``), and the sandbox's isolation on this machine (launcher, seccomp,
layers).

    .venv/bin/python bench/code_verifier.py [--workers 2] [--limit 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor

from dpgrpo.tasks import get_task, load_problems
from dpgrpo.tasks.sandbox import isolation
from dpgrpo.training.runtime import PeakRSS


def _rate(task, problems, responses, workers: int) -> tuple[float, float, int]:
    """(wall seconds, verifications per second, number correct) with ``workers`` in flight."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(lambda pr: task.verify(pr[1], pr[0]), zip(problems, responses)))
    wall = time.perf_counter() - start
    return wall, len(problems) / wall, sum(v.correct for v in verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    start = time.perf_counter()
    with PeakRSS(interval=0.01) as mem:
        for name in ("humaneval", "code"):
            rows += _task_rows(name, args.limit, args.workers)
    total = {"wall_s": round(time.perf_counter() - start, 1),
             "peak_rss_mib": round(mem.peak / 2**20, 1),
             "peak_child_rss_mib": round(_child_rss_bytes() / 2**20, 1),
             "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    if args.json:
        print(json.dumps({"isolation": isolation(), "rows": rows, "total": total}, indent=2))
        return
    for key, value in isolation().items():
        print(f"{key:12s} {value}")
    print("| task | completions | workers | n | correct | wall s | tests/s "
          "| ms per test per worker |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['task']} | {r['completions']} | {r['workers']} | {r['n']} | {r['correct']} "
              f"| {r['wall_s']} | {r['tests_per_second']} | {r['ms_per_test']} |")
    print(f"total: {total}")


def _child_rss_bytes() -> int:
    """Peak RSS of the largest finished child (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def _task_rows(name: str, limit: int, workers: int) -> list[dict]:
    """Rows of one task: passing and failing completions, 1 and ``workers`` in flight."""
    rows = []
    task = get_task(name)
    problems = load_problems(task, "eval")[:limit]
    kinds = {"canonical (pass)": [task.gold_target(p) for p in problems],
             "bare prompt (fail)": [f"```python\n{p.question}```" for p in problems]}
    for kind, responses in kinds.items():
        for in_flight in sorted({1, workers}):
            wall, rate, correct = _rate(task, problems, responses, in_flight)
            rows.append({"task": name, "completions": kind, "workers": in_flight,
                         "n": len(problems), "correct": correct, "wall_s": round(wall, 2),
                         "tests_per_second": round(rate, 1),
                         "ms_per_test": round(1000 * in_flight / rate, 1)})
    return rows


if __name__ == "__main__":
    main()
