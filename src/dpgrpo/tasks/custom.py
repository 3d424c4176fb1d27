"""Tasks built from your own problems and reward functions (the Python API, ``dpgrpo.make_task``).

**Problems** are dicts, :class:`~dpgrpo.tasks.Problem` records or ``datasets`` rows. A row
names its prompt with ``question``, or with TRL's ``prompt`` column: plain text, or
conversational (a list of ``{"role", "content"}`` messages ending with a user turn, or with an
assistant turn that the model continues), rendered with the tokenizer's chat template as TRL's
``apply_chat_template`` does. A plain-text prompt is one user turn under the chat template
(TRL would feed it raw). ``prompt`` wins when a row has both; every other column reaches the
reward functions. A bad row raises :class:`~dpgrpo.errors.DataError` naming row and field.

**Reward functions** come in two conventions, mixed freely:

* dpgrpo's, one completion at a time: ``reward(completion: str, problem) -> float``, where
  ``problem`` is the record exactly as you gave it (a dict, a ``datasets`` row or a Problem);
* TRL's, ``reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]``
  (recognised by its ``prompts`` or ``completions`` parameter, or marked with
  :func:`~dpgrpo.tasks.trl_rewards.trl_reward`), called with ONE prompt's G completions and
  that prompt's columns only (:mod:`dpgrpo.tasks.trl_rewards`).

Several reward functions are **summed** (TRL's convention), optionally weighted by
``reward_weights``; GRPO normalizes rewards within each prompt's group, so their scale does not
matter. A reward that is None (TRL: "does not apply") or not a finite number counts as 0.0 (a
fixed rule: invariant 3; TRL's ``nansum``). Privacy: a reward function is public code and must
depend only on its own call's arguments: state shared between calls (a cache, a counter, a
running mean) would carry one problem's data into another prompt's gradient and break the
guarantee. A reward function that raises ends the run with one ``error:`` line naming it and the
round, which stays charged (``dpgrpo train --resume`` continues once it is fixed): a crash that can
depend on the data (the certificate's ``crashes`` note), so make it total. Rewards run in-process,
without the built-in verifiers' wall-clock bound.

The number of problems in a list is private unless the list itself is published, so a run of a
:class:`RewardTask` needs a public n: ``data.n_slots`` (``n_slots=`` in :func:`dpgrpo.train`;
``len(problems)`` only if the list is public, else a public upper bound) or ``data.limit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dpgrpo.errors import ConfigError, DataError, DPGRPOError, UserCodeError
from dpgrpo.tasks.base import LoadedSplit, Problem, Verdict, VerifiedTask
from dpgrpo.tasks.trl_rewards import TRLReward, is_trl_reward, trl_reward

if TYPE_CHECKING:
    from dpgrpo.tasks.base import Task

#: ``reward(completion, problem) -> float`` (dpgrpo's convention), or TRL's
#: ``reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]``.
RewardFn = Callable[..., Any]


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
    records: Mapping[str, object] = field(default_factory=dict, hash=False, compare=False)

    #: n must come from data.n_slots or data.limit: the list's length is private (run_setup).
    requires_public_n: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.reward_fns:
            raise ConfigError(f"task {self.name!r}: give at least one reward function")
        for fn in self.reward_fns:
            if isinstance(fn, str):
                raise ConfigError(f"task {self.name!r}: reward {fn!r} names a reward model, as "
                                  "TRL allows; dpgrpo takes functions: load the model and call "
                                  "it inside a reward function")
            if not callable(fn):
                raise ConfigError(f"task {self.name!r}: reward {fn!r} is not callable")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_fns):
            raise ConfigError(f"task {self.name!r}: {len(self.reward_weights)} reward_weights "
                              f"for {len(self.reward_fns)} reward functions")
        from dpgrpo.config.values import check_weights

        try:                                 # a NaN weight makes every reward 0: no signal
            check_weights(self.reward_weights)
        except ConfigError as err:
            raise ConfigError(f"task {self.name!r}: {err}") from None

    def group_rewards(self, responses: Sequence[str], problem: Problem,
                      completion_ids: Sequence[Sequence[int]] | None = None) -> list[float]:
        """One prompt's rewards: per response, the sum of ``weight * value`` over the reward
        functions, a None or non-finite value counting 0.0. A TRL function gets all of
        ``responses`` in one call (they are one prompt's), a dpgrpo one each response alone."""
        record = self.records.get(problem.id, problem)
        weights = self.reward_weights or (1.0,) * len(self.reward_fns)
        totals = [0.0] * len(responses)
        for fn, weight in zip(self.reward_fns, weights):
            try:  # user code: its exception becomes one line naming it, not a traceback
                values = (fn(self.prompt(problem), responses, record, completion_ids)
                          if isinstance(fn, TRLReward)
                          else [_number(fn(response, record)) for response in responses])
            except DPGRPOError:
                raise
            except Exception as err:
                raise _reward_error(self.name, fn, err) from None
            for j, value in enumerate(values):
                totals[j] += weight * value if math.isfinite(value) else 0.0
        return totals

    def reward(self, response: str, problem: Problem) -> float:
        """:meth:`group_rewards` of one response alone (evaluation, the audit)."""
        return self.group_rewards([response], problem)[0]

    def verify(self, response: str, problem: Problem) -> Verdict:
        value = self.reward(response, problem)
        return Verdict(value >= self.success_threshold, f"{value:.6g}")

    def scorers(self) -> dict[str, Callable[..., Verdict]]:
        """One role, ``strict``: reward >= ``success_threshold``."""
        def strict(response: str, problem: Problem, *, hit_cap: bool = False,
                   timeout_s: float | None = None) -> Verdict:
            return self.verify(response, problem)

        return {"strict": strict}


def _reward_error(task: str, fn: object, err: Exception) -> UserCodeError:
    """A reward function's exception as one line naming ``module.function``."""
    inner = fn.fn if isinstance(fn, TRLReward) else fn
    where = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"
    text = " ".join(str(err).split())
    return UserCodeError(f"task {task!r}: reward function {where} raised "
                         f"{type(err).__name__}" + (f": {text}" if text else ""))


def _number(value: Any) -> float:
    """A reward value as a float; None ("does not apply") as NaN, which then counts 0.0."""
    return math.nan if value is None else float(value)


def _text(row: Mapping[str, object], keys: Sequence[str], where: str, line: int) -> str | None:
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


def _conversation(value: object, where: str, line: int) -> str:
    """Check TRL's conversational prompt; return the text of its last user turn."""
    def bad(message: str, field: str = "prompt") -> DataError:
        return DataError(message, path=where, line=line, field=field)

    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        raise bad("expected a string or a nonempty list of {'role', 'content'} messages, "
                  f"got {type(value).__name__}" + (" (empty)" if not value else ""))
    for k, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise bad(f"expected a {{'role', 'content'}} message, got {type(message).__name__}",
                      f"prompt[{k}]")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise bad(f"expected a string, got {type(message.get(key)).__name__}",
                          f"prompt[{k}].{key}")
    if value[-1]["role"] not in ("user", "assistant"):
        raise bad("the last message must be a user turn (answered) or an assistant turn "
                  f"(continued), as in TRL; got {value[-1]['role']!r}",
                  f"prompt[{len(value) - 1}].role")
    users = [m["content"] for m in value if m["role"] == "user" and m["content"].strip()]
    if not users:
        raise bad("a conversational prompt needs a user message with text")
    return users[-1]


def to_problem(record: object, index: int, *, prefix: str, where: str = "problems") -> Problem:
    """A :class:`Problem` from a record: a Problem as is, or a mapping with TRL's ``prompt``
    (text or a conversation) or ``question``, optional ``id``, ``answer``, ``solution``.
    ``index`` counts from 0; the question of a conversation is its last user turn."""
    if isinstance(record, Problem):
        return record
    if not isinstance(record, Mapping):
        raise DataError(f"expected a dict or dpgrpo.tasks.Problem, got {type(record).__name__}",
                        path=where, line=index + 1)
    prompt = record.get("prompt")
    if prompt is not None and not isinstance(prompt, (str, int, float)):
        question: str | None = _conversation(prompt, where, index + 1)
    else:
        question = _text(record, ("prompt", "question"), where, index + 1)
    if question is None or not question.strip():
        raise DataError("missing or empty (a record needs 'question' or 'prompt')", path=where,
                        line=index + 1, field="prompt" if prompt is not None else "question")
    ident = _text(record, ("id",), where, index + 1) or f"{prefix}-{index:06d}"
    return Problem(ident, question, _text(record, ("answer",), where, index + 1) or "",
                   solution=_text(record, ("solution",), where, index + 1))


def _records(problems: Iterable[object], prefix: str,
             where: str) -> tuple[list[Problem], dict[str, object]]:
    out: list[Problem] = []
    records: dict[str, object] = {}
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


def make_task(problems: Iterable[object], rewards: RewardFn | Sequence[RewardFn], *,
              name: str = "custom", eval_problems: Iterable[object] | None = None,
              prompt: Callable[[Any], str] | None = None,
              reward_weights: Sequence[float] | None = None, success_threshold: float = 1.0,
              max_new_tokens: int = 256, gold: Callable[[Any], str] | None = None) -> RewardTask:
    """A task from your problems (``train`` split; ``eval_problems`` for ``eval``) and rewards.

    ``prompt(record)`` renders the prompt, a user message or a conversation (default: the
    row's ``prompt``, else its question; the chat template is applied later). ``rewards``: one
    function or several, in either convention (module docstring). ``gold(record) -> str`` is the
    gold-SFT target (default: the solution, else the answer). The task is not registered:
    :func:`dpgrpo.train` does that.
    """
    fns = (rewards,) if callable(rewards) or isinstance(rewards, str) else tuple(rewards)
    fns = tuple(trl_reward(fn) if is_trl_reward(fn) else fn for fn in fns)
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

    def render_prompt(problem: Problem) -> Any:
        record = records.get(problem.id, problem)
        if prompt is not None:
            return prompt(record)
        given = record.get("prompt") if isinstance(record, Mapping) else None
        if given is not None and not isinstance(given, (str, int, float)):
            return [{"role": m["role"], "content": m["content"]} for m in given]
        return problem.question

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


def check_public_n(task: Task, n_slots: int | None, limit: int | None) -> None:
    """Refuse a task whose size is private (:class:`RewardTask`) without a public n."""
    if getattr(task, "requires_public_n", False) and n_slots is None and limit is None:
        raise ConfigError(
            f"task {task.name!r} trains on a list of problems whose length is private: set "
            "data.n_slots (dpgrpo.train(..., n_slots=N)) to a public number of slots, "
            "len(problems) only if the list itself is published, else a public upper bound")


__all__ = ["RewardFn", "RewardTask", "check_public_n", "make_task", "to_problem", "trl_reward"]
