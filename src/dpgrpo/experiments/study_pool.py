"""The study's worker pool: independent tasks, each after its prerequisite, in N processes.

:mod:`dpgrpo.experiments.study` splits its work into resumable tasks and says which task each
one waits for; this module only schedules them, knowing nothing of what a task does. Workers
are spawned (nothing but the public arguments of a task crosses), each with ``cores // N``
torch threads; a free worker takes the first pending task whose prerequisite is done. A failed
task stops the pool once the running ones finish (every task is resumable).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpgrpo.errors import ConfigError


def _next_tasks(pending: Sequence[str], after: Mapping[str, str | None], done: set[str],
                free: int) -> list[str]:
    """Up to ``free`` pending tasks whose prerequisite is done, in priority (list) order."""
    return [n for n in pending if after.get(n) is None or after[n] in done][:free]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_in_workers(names: Sequence[str], after: Mapping[str, str | None], workers: int,
                   worker: Callable[..., None], say: Callable[[str], None]) -> None:
    """Run every task of ``names`` (priority order) as ``worker(name=..., threads=...)`` in
    ``workers`` spawned processes, each task once its prerequisite ``after[name]`` is done."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, _cores() // workers)
    say(f"{len(names)} tasks on {workers} workers, {threads} thread(s) each")
    pending, running, done = list(names), dict[Any, str](), set[str]()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        while pending or running:
            for name in _next_tasks(pending, after, done, workers - len(running)):
                pending.remove(name)
                running[pool.submit(worker, name=name, threads=threads)] = name
            if not running:   # cannot happen with the study's prerequisites; never spin
                raise ConfigError(f"study tasks {pending} wait for tasks that never run")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                if future.exception() is not None:
                    say(f"task {name} failed: waiting for the running ones (every task is "
                        "resumable)")
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise future.exception()  # type: ignore[misc]
                done.add(name)
