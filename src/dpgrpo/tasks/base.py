"""The task contract: records, verdicts, scorers and the task registry.

A task bundles a prompt template, a strict verifier (which is also the training reward,
Sec. VII-A of the DP-GRPO paper), optional sensitivity scorers (Appendix E) and the loaders of
its splits. Scorers are pure functions ``(response, problem) -> Verdict`` registered by name in
:data:`SCORERS`; tasks refer to them by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from dpgrpo.errors import ConfigError, DataError, DPGRPOError, UserCodeError
from dpgrpo.tasks.bounded import run_bounded

#: Default wall-clock bound of one symbolic check, in seconds (a timeout counts as incorrect).
DEFAULT_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Problem:
    """One private record: the prompt and its reference answer."""

    id: str
    question: str  # problem text (CSQA: the question stem)
    answer: str  # reference answer (GSM8K number, MATH boxed content, CSQA letter; code: tests)
    solution: str | None = None  # worked solution (GSM8K, MATH) for gold SFT
    choices: tuple[tuple[str, str], ...] | None = None  # CSQA (label, text)
    contributor: str | None = None  # who contributed it (contributor-level DP; data field or map)


@dataclass(frozen=True)
class Verdict:
    """What a scorer decided about one response."""

    correct: bool
    extracted: str | None  # what the scorer read from the response (None: no extraction)
    timed_out: bool = False  # the symbolic check hit its bound (or its guard) and counts wrong


class Scorer(Protocol):
    """A pure scoring function. ``hit_cap`` says the response was cut at the token cap."""

    def __call__(self, response: str, problem: Problem, *, hit_cap: bool = False,
                 timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict: ...


#: Every scorer, by registered name (e.g. ``"math_boxed"``, ``"final_number"``).
SCORERS: dict[str, Scorer] = {}


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    """Decorator: register a pure scorer under ``name`` (names are unique)."""

    def add(fn: Scorer) -> Scorer:
        if name in SCORERS:
            raise ValueError(f"scorer {name!r} is already registered")
        SCORERS[name] = fn
        return fn

    return add


def get_scorer(name: str) -> Scorer:
    """The registered scorer called ``name``."""
    try:
        return SCORERS[name]
    except KeyError:
        raise ConfigError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}") from None


def _score(scorer: Scorer, response: str, problem: Problem, hit_cap: bool,
           timeout_s: float) -> Verdict:
    return scorer(response, problem, hit_cap=hit_cap, timeout_s=timeout_s)


def bounded_score(scorer: Scorer, response: str, problem: Problem, *, hit_cap: bool = False,
                  timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """Run ``scorer`` whole, extraction included, within ``timeout_s`` seconds of wall clock.

    A response built to stall a scorer cannot stall training or evaluation: past the bound it
    is incorrect, with ``timed_out`` set.
    """
    verdict, timed_out = run_bounded(_score, (scorer, response, problem, hit_cap, timeout_s),
                                     timeout_s)
    return Verdict(False, None, True) if timed_out or verdict is None else verdict


@dataclass(frozen=True)
class LoadedSplit:
    """A built split: its problems, the records skipped under ``skip_invalid``, and the counts
    of valid problems removed by the split's definition (e.g. MATH-500 from MATH's eval set)."""

    problems: list[Problem]
    skipped: tuple[DataError, ...] = ()
    excluded: Mapping[str, int] = field(default_factory=dict)


#: ``loader(data_dir, skip_invalid=..., source=...)`` builds one split.
SplitLoader = Callable[..., LoadedSplit]


@runtime_checkable
class Task(Protocol):
    """The interface the trainer and the evaluator use (docs/architecture.md)."""

    # read-only: a frozen dataclass (VerifiedTask) or plain attributes both provide them
    @property
    def name(self) -> str: ...
    @property
    def default_max_new_tokens(self) -> int: ...

    def prompt(self, problem: Problem) -> str: ...
    def verify(self, response: str, problem: Problem) -> Verdict: ...
    def reward(self, response: str, problem: Problem) -> float: ...
    def scorers(self) -> dict[str, Callable[..., Verdict]]: ...
    def gold_target(self, problem: Problem) -> str: ...


def completion_cap(task: Task, max_new_tokens: int | None) -> int:
    """The completion cap of a run or an evaluation: ``max_new_tokens`` when set, else the
    task's default (public either way)."""
    return max_new_tokens or task.default_max_new_tokens


@dataclass(frozen=True)
class VerifiedTask:
    """A concrete :class:`Task` assembled from a template, registered scorers and loaders.

    ``scorer_names`` maps the task's roles (``"strict"`` always; ``"robust"`` on MATH;
    ``"final"`` on CommonsenseQA) to names in :data:`SCORERS`. ``check_timeout_s`` bounds each
    symbolic check; a timeout counts as incorrect and is reported in the verdict.
    """

    name: str
    default_max_new_tokens: int
    render_prompt: Callable[[Problem], str]
    render_gold: Callable[[Problem], str]
    scorer_names: Mapping[str, str]
    splits: Mapping[str, SplitLoader]
    needs_data_dir: bool = True
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    description: str = ""

    def __post_init__(self) -> None:
        if "strict" not in self.scorer_names:
            raise ConfigError(f"task {self.name!r} has no strict scorer")
        if self.check_timeout_s <= 0:
            raise ConfigError(f"check_timeout_s must be positive, got {self.check_timeout_s}")

    def prompt(self, problem: Problem) -> str:
        """The user message for ``problem`` (the chat template is applied later)."""
        return self.render_prompt(problem)

    def verify(self, response: str, problem: Problem) -> Verdict:
        """The strict scorer, which is also the training reward."""
        return self.scorers()["strict"](response, problem)

    def reward(self, response: str, problem: Problem) -> float:
        """1.0 if the strict verifier accepts ``response``, else 0.0 (binary RLVR reward)."""
        return 1.0 if self.verify(response, problem).correct else 0.0

    def scorers(self) -> dict[str, Callable[..., Verdict]]:
        """Role -> scorer, each run whole under this task's check timeout."""
        return {role: functools.partial(bounded_score, get_scorer(name),
                                        timeout_s=self.check_timeout_s)
                for role, name in self.scorer_names.items()}

    def gold_target(self, problem: Problem) -> str:
        """The gold-SFT target text (worked solution, or the answer declaration)."""
        return self.render_gold(problem)

    def load_split(self, split: str, data_dir: str | Path | None = None, *,
                   skip_invalid: bool = False, source: str = "local") -> LoadedSplit:
        """Build ``split`` from ``data_dir`` (local files) or the Hugging Face hub."""
        if split not in self.splits:
            raise ConfigError(f"task {self.name!r} has no split {split!r}; "
                              f"known: {', '.join(self.splits)}")
        if source not in ("local", "hub"):
            raise ConfigError(f"source must be 'local' or 'hub', got {source!r}")
        if source == "local" and self.needs_data_dir and data_dir is None:
            raise ConfigError(f"task {self.name!r} reads benchmark files: pass a data directory "
                              "(e.g. --data-dir ../shared/data) or use source='hub'")
        return self.splits[split](data_dir, skip_invalid=skip_invalid, source=source)


_TASKS: dict[str, VerifiedTask] = {}


def register_task(task: VerifiedTask, *, replace: bool = False) -> VerifiedTask:
    """Make ``task`` available to :func:`get_task` under ``task.name``.

    ``replace`` lets a task built from your problems (``dpgrpo.make_task``) take over the name
    of an earlier one of its kind; a built-in task is never replaced.
    """
    old = _TASKS.get(task.name)
    if old is not None and not (replace and getattr(old, "requires_public_n", False)):
        raise ValueError(f"task {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def get_task(name: str, *, check_timeout_s: float | None = None) -> VerifiedTask:
    """The task called ``name`` (optionally with another check timeout).

    Besides the registered names, ``name`` may be ``package.module:attr`` or the name of an
    entry point in the group ``dpgrpo.tasks``; either resolves to a :class:`VerifiedTask` (e.g.
    from ``dpgrpo.make_task``) or to a factory, called without arguments, that returns one. The
    task is registered under ``name``, so runs, predictions and resumes name it the same way.
    """
    task = _TASKS.get(name) or _load_external(name)
    if check_timeout_s is not None:
        from dataclasses import replace

        task = replace(task, check_timeout_s=check_timeout_s)
    return task


def _load_external(name: str) -> VerifiedTask:
    """Import ``package.module:attr`` or load the ``dpgrpo.tasks`` entry point ``name``."""
    import importlib
    import importlib.metadata
    from dataclasses import replace

    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            obj: object = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError, ValueError) as err:
            raise ConfigError(f"task {name!r}: cannot load {attr!r} from module "
                              f"{module_name!r} ({err})") from None
        except SyntaxError as err:  # the user's module does not parse
            raise UserCodeError(f"task {name!r}: module {module_name!r} has a syntax error "
                                f"({err.filename}, line {err.lineno}: {err.msg})") from None
        except Exception as err:  # the user's module raised while it was imported
            raise UserCodeError(f"task {name!r}: importing module {module_name!r} raised "
                                f"{_describe(err)}") from None
    else:
        found = importlib.metadata.entry_points(group="dpgrpo.tasks", name=name)
        if not found:
            raise ConfigError(f"unknown task {name!r}; known: {', '.join(task_names())} (or "
                              "package.module:attr, or an entry point of group dpgrpo.tasks)")
        obj = next(iter(found)).load()
    if not isinstance(obj, VerifiedTask) and callable(obj):
        try:
            obj = obj()
        except DPGRPOError:
            raise
        except Exception as err:  # the user's factory failed
            raise UserCodeError(f"task {name!r}: the factory {name}() raised "
                                f"{_describe(err)}") from None
    if not isinstance(obj, VerifiedTask):
        raise ConfigError(f"task {name!r} resolved to a {type(obj).__name__}: expected a "
                          "dpgrpo.tasks.VerifiedTask (e.g. from dpgrpo.make_task) or a factory "
                          "returning one")
    _TASKS[name] = replace(obj, name=name)
    return _TASKS[name]


def _describe(err: BaseException) -> str:
    """``Type: message`` of an exception from user code, on one line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def task_names() -> list[str]:
    """Names of the registered tasks."""
    return list(_TASKS)
