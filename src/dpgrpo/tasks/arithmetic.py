"""The embedded default task: arithmetic word problems generated offline from a public seed.

No files and no download: every problem is drawn from fixed templates by ``random.Random``
with a public seed, so the splits are identical on every machine. ``train`` has 1,000 problems
(seed 0) and ``eval`` 200 (seed 1), disjoint by question text; ids are ``arith-train-00017``.
The prompt and verifier are GSM8K's (final number). ``difficulty`` sets the mix:

* 1: one-step addition of two numbers from 2 to 5;
* 2: one-step addition and subtraction with numbers up to 10;
* 3: the same with numbers up to 20;
* 4: half one-step (all four operations, small factors), half two-step;
* 5: two-step only, with numbers up to 50.

SmolLM2-135M-Instruct (the Q4_1 GGUF of the ``smollm2-135m`` alias) is a weak solver. Its
greedy base accuracy with ``dpgrpo eval`` on the first 50 eval problems (256-token cap) was
28% (14/50) at level 1; on the first 30 problems, 23% at level 2 and 14-23% at level 3.
Level 1, the default, keeps it inside the 20%-80% band where GRPO groups get mixed rewards.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dpgrpo.errors import ConfigError
from dpgrpo.tasks.base import LoadedSplit, Problem, VerifiedTask, register_task
from dpgrpo.tasks.gsm8k import answer_sentence, number_prompt

DEFAULT_DIFFICULTY = 1
DEFAULT_SIZES = {"train": 1000, "eval": 200}
SEEDS = {"train": 0, "eval": 1}

_PEOPLE = [("Tom", "he"), ("Sara", "she"), ("Liam", "he"), ("Emma", "she"), ("Noah", "he"),
           ("Mia", "she"), ("Omar", "he"), ("Lena", "she"), ("Ravi", "he"), ("Zoe", "she"),
           ("Ben", "he"), ("Ana", "she"), ("Kai", "he"), ("Ivy", "she"), ("Leo", "he"),
           ("Nora", "she")]
_ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "flowers",
          "stamps", "shells", "balloons", "candies", "beads", "eggs", "oranges", "crayons",
          "coins", "buttons", "cupcakes", "toy cars"]
#: the names and items of ``arithmetic-proxy``: none of them is a word of the lists above, so
#: no proxy question equals, or shares 13 consecutive words with, a question of the other
#: tasks (every window of 13 words of a level-1 question holds a name or an item)
_PROXY_PEOPLE = [("Adam", "he"), ("Beth", "she"), ("Carl", "he"), ("Dina", "she"),
                 ("Evan", "he"), ("Faye", "she"), ("Gus", "he"), ("Hana", "she"), ("Ian", "he"),
                 ("Jade", "she"), ("Karl", "he"), ("Lucy", "she"), ("Max", "he"),
                 ("Nina", "she"), ("Owen", "he"), ("Rosa", "she")]
_PROXY_ITEMS = ["pears", "erasers", "ribbons", "pebbles", "muffins", "comics", "postcards",
                "tulips", "badges", "feathers", "kites", "lollipops", "rings", "plums", "lemons",
                "markers", "tokens", "bracelets", "donuts", "puzzles"]
#: which names and items a task draws from: "default" or "proxy"
VOCABULARIES = {"default": (_PEOPLE, _ITEMS), "proxy": (_PROXY_PEOPLE, _PROXY_ITEMS)}

# A template draws its numbers and returns (question, solution steps, answer).
Template = Callable[[random.Random, str, str, str, int], tuple[str, list[str], int]]


def _add(rng: random.Random, name: str, he: str, item: str, top: int) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, top), rng.randint(2, top)
    return (f"{name} has {a} {item}. {he.capitalize()} buys {b} more {item}. "
            f"How many {item} does {name} have now?",
            [f"{name} has {a} + {b} = {a + b} {item}."], a + b)


def _sub(rng: random.Random, name: str, he: str, item: str, top: int) -> tuple[str, list[str], int]:
    a = rng.randint(5, top + 5)
    b = rng.randint(1, a - 1)
    return (f"{name} has {a} {item}. {he.capitalize()} gives {b} {item} to a friend. "
            f"How many {item} does {name} have left?",
            [f"{name} has {a} - {b} = {a - b} {item} left."], a - b)


def _mul(rng: random.Random, name: str, he: str, item: str, top: int) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, min(top, 10)), rng.randint(2, min(top, 10))
    return (f"{name} buys {a} bags of {item}. Each bag has {b} {item}. "
            f"How many {item} does {name} buy in total?",
            [f"{name} buys {a} x {b} = {a * b} {item}."], a * b)


def _div(rng: random.Random, name: str, he: str, item: str, top: int) -> tuple[str, list[str], int]:
    each, friends = rng.randint(2, min(top, 10)), rng.randint(2, 6)
    total = each * friends
    return (f"{name} shares {total} {item} equally among {friends} friends. "
            f"How many {item} does each friend get?",
            [f"Each friend gets {total} / {friends} = {each} {item}."], each)


def _add_sub(rng: random.Random, name: str, he: str, item: str,
             top: int) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, top), rng.randint(2, top)
    c = rng.randint(1, a + b - 1)
    return (f"{name} has {a} {item}. {he.capitalize()} buys {b} more and then gives {c} to a "
            f"friend. How many {item} does {name} have now?",
            [f"After buying, {name} has {a} + {b} = {a + b} {item}.",
             f"After giving some away, {he} has {a + b} - {c} = {a + b - c} {item}."],
            a + b - c)


def _mul_add(rng: random.Random, name: str, he: str, item: str,
             top: int) -> tuple[str, list[str], int]:
    a, b, c = rng.randint(2, min(top, 10)), rng.randint(2, min(top, 10)), rng.randint(1, top)
    return (f"{name} already has {c} {item}. {he.capitalize()} buys {a} boxes with {b} {item} "
            f"in each box. How many {item} does {name} have now?",
            [f"The boxes hold {a} x {b} = {a * b} {item}.",
             f"{name} has {a * b} + {c} = {a * b + c} {item}."], a * b + c)


def _price_change(rng: random.Random, name: str, he: str, item: str,
                  top: int) -> tuple[str, list[str], int]:
    count, price = rng.randint(2, 6), rng.randint(2, min(top, 9))
    bill = next(b for b in (10, 20, 50, 100) if b > count * price)
    return (f"{name} buys {count} {item} for {price} dollars each and pays with a {bill}-dollar "
            f"bill. How many dollars of change does {he} get?",
            [f"The {item} cost {count} x {price} = {count * price} dollars.",
             f"The change is {bill} - {count * price} = {bill - count * price} dollars."],
            bill - count * price)


_ONE_STEP: list[Template] = [_add, _sub, _mul, _div]
_TWO_STEP: list[Template] = [_add_sub, _mul_add, _price_change]
_LEVELS: dict[int, tuple[list[Template], float, int]] = {
    # level: (one-step templates, probability of a two-step problem, largest operand)
    1: ([_add], 0.0, 5),
    2: ([_add, _sub], 0.0, 10),
    3: ([_add, _sub], 0.0, 20),
    4: (_ONE_STEP, 0.5, 20),
    5: (_ONE_STEP, 1.0, 50),
}


def _draw(rng: random.Random, difficulty: int, vocabulary: str = "default"
          ) -> tuple[str, str, int]:
    one_step, p_two, top = _LEVELS[difficulty]
    people, items = VOCABULARIES[vocabulary]
    template = rng.choice(_TWO_STEP) if rng.random() < p_two else rng.choice(one_step)
    name, he = rng.choice(people)
    question, steps, answer = template(rng, name, he, rng.choice(items), top)
    return question, "\n".join([*steps, answer_sentence(str(answer))]), answer


def generate_problems(split: str, n: int | None = None, *, seed: int | None = None,
                      difficulty: int = DEFAULT_DIFFICULTY,
                      exclude: set[str] | None = None,
                      vocabulary: str = "default") -> list[Problem]:
    """``n`` distinct problems of ``split`` from ``seed`` (defaults: the split's size and seed),
    skipping any question in ``exclude``, with the names and items of ``vocabulary``
    (:data:`VOCABULARIES`). Deterministic for fixed arguments."""
    if difficulty not in _LEVELS:
        raise ConfigError(f"difficulty must be one of {sorted(_LEVELS)}, got {difficulty}")
    if vocabulary not in VOCABULARIES:
        raise ConfigError(f"vocabulary must be one of {sorted(VOCABULARIES)}, got {vocabulary!r}")
    n = DEFAULT_SIZES.get(split, 0) if n is None else n
    if n <= 0:
        raise ConfigError(f"need a positive problem count for split {split!r}, got {n}")
    rng = random.Random(SEEDS.get(split, 0) if seed is None else seed)
    seen = set(exclude or ())
    problems: list[Problem] = []
    for _ in range(1000 * n):
        question, solution, answer = _draw(rng, difficulty, vocabulary)
        if question in seen:
            continue
        seen.add(question)
        problems.append(Problem(f"arith-{split}-{len(problems):05d}", question, str(answer),
                                solution=solution))
        if len(problems) == n:
            return problems
    raise ConfigError(f"could not draw {n} distinct problems at difficulty {difficulty}")


def _loader(split: str, difficulty: int, sizes: dict[str, int],
            seeds: dict[str, int] | None = None, vocabulary: str = "default"):
    seeds = seeds or SEEDS

    def load(data_dir: str | Path | None = None, *, skip_invalid: bool = False,
             source: str = "local") -> LoadedSplit:
        if source != "local":
            raise ConfigError("the arithmetic task is generated offline; source must be 'local'")
        exclude = None
        if split == "eval":  # disjoint from the train split built with the same settings
            exclude = {p.question for p in generate_problems(
                "train", sizes["train"], seed=seeds["train"], difficulty=difficulty,
                vocabulary=vocabulary)}
        return LoadedSplit(generate_problems(split, sizes[split], seed=seeds[split],
                                             difficulty=difficulty, exclude=exclude,
                                             vocabulary=vocabulary))

    return load


def make_arithmetic_task(difficulty: int = DEFAULT_DIFFICULTY, *, n_train: int = 1000,
                         n_eval: int = 200) -> VerifiedTask:
    """An arithmetic task with another difficulty or split sizes (not registered)."""
    sizes = {"train": n_train, "eval": n_eval}
    return replace(ARITHMETIC, splits={s: _loader(s, difficulty, sizes) for s in sizes})


ARITHMETIC = register_task(VerifiedTask(
    name="arithmetic",
    default_max_new_tokens=256,
    render_prompt=number_prompt,
    render_gold=lambda problem: problem.solution or answer_sentence(problem.answer),
    scorer_names={"strict": "final_number"},
    splits={s: _loader(s, DEFAULT_DIFFICULTY, DEFAULT_SIZES) for s in DEFAULT_SIZES},
    needs_data_dir=False,
    description="embedded arithmetic word problems (generated from a public seed)",
))

ARITHMETIC_HARD = register_task(replace(
    ARITHMETIC, name="arithmetic-hard",
    splits={s: _loader(s, 4, DEFAULT_SIZES) for s in DEFAULT_SIZES},
    description="embedded arithmetic word problems, level 4: all four operations, half of them "
                "two-step (generated from a public seed)"))

#: the other levels by number: ``arithmetic-2`` (add and subtract up to 10), ``arithmetic-3``
#: (up to 20), ``arithmetic-5`` (two-step up to 50); level 1 is ``arithmetic``, 4 is ``-hard``
ARITHMETIC_LEVELS = {level: register_task(replace(
    ARITHMETIC, name=f"arithmetic-{level}",
    splits={s: _loader(s, level, DEFAULT_SIZES) for s in DEFAULT_SIZES},
    description=f"embedded arithmetic word problems, level {level} (generated from a public "
                "seed)")) for level in (2, 3, 5)}

#: seeds of ``arithmetic-proxy``: level 1 drawn again, none of them a seed of ``arithmetic``
PROXY_SEEDS = {"train": 2, "eval": 3}
#: ``arithmetic-proxy``: the level-1 templates and numbers with other names and items
#: (``VOCABULARIES["proxy"]``) under other public seeds, for choosing settings of a run on
#: ``arithmetic`` (``dpgrpo tune --proxy arithmetic-proxy``). No proxy question equals or shares
#: 13 consecutive words with a question of ``arithmetic`` (disjoint by construction, and checked
#: by content before tuning: :mod:`dpgrpo.privacy.public_data`). Until 2026-12-05 it used the
#: same names and items, and 189 of its 1,000 training questions were word for word in
#: ``arithmetic``'s training split. Its eval split is disjoint from its own train split.
ARITHMETIC_PROXY = register_task(replace(
    ARITHMETIC, name="arithmetic-proxy",
    splits={s: _loader(s, DEFAULT_DIFFICULTY, DEFAULT_SIZES, PROXY_SEEDS, "proxy")
            for s in DEFAULT_SIZES},
    description="embedded arithmetic word problems, level 1 with other names and items under "
                "other public seeds (train 2, eval 3): a proxy for tuning runs on the level-1 "
                "task that shares none of its questions"))
