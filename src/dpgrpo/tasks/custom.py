"""Tasks built from your own problems and reward functions (the Python API, ``dpgrpo.make_task``).

A reward function follows TRL's convention for reward callables, one completion at a time::

    def reward(completion: str, problem) -> float: ...

``problem`` is the record exactly as you gave it (a dict, a ``datasets`` row or a
:class:`~dpgrpo.tasks.Problem`). Several reward functions are **summed** (TRL's convention),
optionally weighted by ``reward_weights``; GRPO normalizes rewards within each prompt's group,
so their scale does not matter. A reward that is not a finite number counts as 0.0 (a fixed
rule: invariant 3). Privacy: a reward function is public code and must depend only on its own
``(completion, problem)``: state shared between calls (a cache, a counter, a running mean) would
carry one problem's data into another prompt's gradient and break the guarantee. A reward
function that raises ends the run, a crash that can depend on the data (the certificate's
``crashes`` note): make it total. Rewards run in-process, without the built-in verifiers'
wall-clock bound.

The number of problems in a list is private unless the list itself is published, so a run of a
:class:`RewardTask` needs a public n: ``data.n_slots`` (``n_slots=`` in :func:`dpgrpo.train`;
``len(problems)`` only if the list is public, else a public upper bound) or ``data.limit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dpgrpo.errors import ConfigError, DataError, UserCodeError
from dpgrpo.tasks.base import LoadedSplit, Problem, Verdict, VerifiedTask

#: ``reward(completion, problem) -> float`` (TRL's reward-callable convention, one completion).
RewardFn = Callable[[str, Any], float]


@dataclass(frozen=True)
class RewardTask(VerifiedTask):
    """A :class:`VerifiedTask` whose training reward is the (weighted) sum of reward functions.

    ``records`` maps each problem id to the record the user gave, which the reward functions
    receive. In evaluation a response counts as correct when its reward is at least
    ``success_threshold`` (1.0: a 0/1 reward's "correct"); ``extracted`` holds the reward.
    """

    reward_fns: tuple[RewardFn, ...] = ()
    reward_weights: tuple[float, ...] | None = None
    success_threshold: float = 1.0
    records: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    #: n must come from data.n_slots or data.limit: the list's length is private (run_setup).
    requires_public_n: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.reward_fns:
            raise ConfigError(f"task {self.name!r}: give at least one reward function")
        for fn in self.reward_fns:
            if not callable(fn):
                raise ConfigError(f"task {self.name!r}: reward {fn!r} is not callable")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_fns):
            raise ConfigError(f"task {self.name!r}: {len(self.reward_weights)} reward_weights "
                              f"for {len(self.reward_fns)} reward functions")

    def reward(self, response: str, problem: Problem) -> float:
        """Sum of ``weight * fn(response, record)``; a non-finite term counts as 0.0."""
        record = self.records.get(problem.id, problem)
        weights = self.reward_weights or (1.0,) * len(self.reward_fns)
        total = 0.0
        for fn, weight in zip(self.reward_fns, weights):
            try:
                value = float(fn(response, record))
            except Exception as err:  # user code: one line naming the function, not a traceback
                where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
                text = " ".join(str(err).split())
                raise UserCodeError(f"task {self.name!r}: reward function {where} raised "
                                    f"{type(err).__name__}: {text}") from None
            total += weight * value if math.isfinite(value) else 0.0
        return total

    def verify(self, response: str, problem: Problem) -> Verdict:
        value = self.reward(response, problem)
        return Verdict(value >= self.success_threshold, f"{value:.6g}")

    def scorers(self) -> dict[str, Callable[..., Verdict]]:
        """One role, ``strict``: reward >= ``success_threshold``."""
        def strict(response: str, problem: Problem, *, hit_cap: bool = False,
                   timeout_s: float | None = None) -> Verdict:
            return self.verify(response, problem)

        return {"strict": strict}


def _text(row: Mapping[str, Any], keys: Sequence[str], where: str, line: int) -> str | None:
    for key in keys:
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise DataError(f"expected a string, got {type(value).__name__}", path=where,
                            line=line, field=key)
        return value
    return None


def to_problem(record: Any, index: int, *, prefix: str, where: str = "problems") -> Problem:
    """A :class:`Problem` from a record: a Problem as is, or a mapping with ``question`` (or
    TRL's ``prompt``), optional ``id``, ``answer``, ``solution``. ``index`` counts from 0."""
    if isinstance(record, Problem):
        return record
    if not isinstance(record, Mapping):
        raise DataError(f"expected a dict or dpgrpo.tasks.Problem, got {type(record).__name__}",
                        path=where, line=index + 1)
    question = _text(record, ("question", "prompt"), where, index + 1)
    if question is None or not question.strip():
        raise DataError("missing or empty (a record needs 'question' or 'prompt')", path=where,
                        line=index + 1, field="question")
    ident = _text(record, ("id",), where, index + 1) or f"{prefix}-{index:06d}"
    return Problem(ident, question, _text(record, ("answer",), where, index + 1) or "",
                   solution=_text(record, ("solution",), where, index + 1))


def _records(problems: Iterable[Any], prefix: str,
             where: str) -> tuple[list[Problem], dict[str, Any]]:
    out: list[Problem] = []
    records: dict[str, Any] = {}
    for i, record in enumerate(problems):  # a list, or a datasets.Dataset (rows are dicts)
        problem = to_problem(record, i, prefix=prefix, where=where)
        if problem.id in records:
            raise DataError(f"duplicate id {problem.id!r}", path=where, line=i + 1, field="id")
        out.append(problem)
        records[problem.id] = record
    if not out:
        raise DataError("no problems", path=where)
    return out, records


def _loader(problems: list[Problem]) -> Callable[..., LoadedSplit]:
    def load(data_dir: str | Path | None = None, *, skip_invalid: bool = False,
             source: str = "local") -> LoadedSplit:
        return LoadedSplit(list(problems))

    return load


def make_task(problems: Iterable[Any], rewards: RewardFn | Sequence[RewardFn], *,
              name: str = "custom", eval_problems: Iterable[Any] | None = None,
              prompt: Callable[[Any], str] | None = None,
              reward_weights: Sequence[float] | None = None, success_threshold: float = 1.0,
              max_new_tokens: int = 256, gold: Callable[[Any], str] | None = None) -> RewardTask:
    """A task from your problems (``train`` split; ``eval_problems`` for ``eval``) and rewards.

    ``prompt(record) -> str`` renders the user message (default: the question as is; the chat
    template is applied later). ``gold(record) -> str`` is the gold-SFT target (default: the
    solution, else the answer). The task is not registered: :func:`dpgrpo.train` does that.
    """
    fns = (rewards,) if callable(rewards) else tuple(rewards)
    train, records = _records(problems, name, "problems")
    splits = {"train": _loader(train)}
    if eval_problems is not None:
        held_out, eval_records = _records(eval_problems, f"{name}-eval", "eval_problems")
        overlap = set(records) & set(eval_records)
        if overlap:
            raise DataError(f"id {sorted(overlap)[0]!r} is in both problems and eval_problems",
                            path="eval_problems", field="id")
        records.update(eval_records)
        splits["eval"] = _loader(held_out)

    def render_prompt(problem: Problem) -> str:
        return prompt(records.get(problem.id, problem)) if prompt else problem.question

    def render_gold(problem: Problem) -> str:
        if gold is not None:
            return gold(records.get(problem.id, problem))
        return problem.solution or problem.answer

    return RewardTask(name=name, default_max_new_tokens=max_new_tokens,
                      render_prompt=render_prompt, render_gold=render_gold,
                      scorer_names={"strict": "reward"}, splits=splits, needs_data_dir=False,
                      description="custom problems and reward functions", reward_fns=fns,
                      reward_weights=None if reward_weights is None else tuple(reward_weights),
                      success_threshold=success_threshold, records=records)


def check_public_n(task: Any, n_slots: int | None, limit: int | None) -> None:
    """Refuse a task whose size is private (:class:`RewardTask`) without a public n."""
    if getattr(task, "requires_public_n", False) and n_slots is None and limit is None:
        raise ConfigError(
            f"task {task.name!r} trains on a list of problems whose length is private: set "
            "data.n_slots (dpgrpo.train(..., n_slots=N)) to a public number of slots, "
            "len(problems) only if the list itself is published, else a public upper bound")


__all__ = ["RewardFn", "RewardTask", "check_public_n", "make_task", "to_problem"]
