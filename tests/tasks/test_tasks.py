"""Task registry, prompt templates and the embedded arithmetic task."""

from __future__ import annotations

import re

import pytest

from dpgrpo.errors import ConfigError
from dpgrpo.tasks import (
    Problem,
    Task,
    generate_problems,
    get_task,
    load_problems,
    make_arithmetic_task,
    task_names,
)

CHOICES = (("A", "bank"), ("B", "library"), ("C", "department store"), ("D", "mall"),
           ("E", "new york"))


def test_registry_holds_the_five_tasks_and_they_satisfy_the_protocol() -> None:
    assert {"arithmetic", "gsm8k", "math", "csqa", "svamp"} <= set(task_names())  # + test tasks
    for name in task_names():
        assert isinstance(get_task(name), Task)
    caps = {name: get_task(name).default_max_new_tokens for name in task_names()}
    assert caps["math"] == 1024 and caps["gsm8k"] == caps["csqa"] == caps["svamp"] == 512


def test_prompts_follow_the_paper() -> None:
    problem = Problem("x", "What is 2+2?", "4")
    math_prompt = get_task("math").prompt(problem)
    assert math_prompt.startswith("What is 2+2?") and "\\boxed{}" in math_prompt
    gsm8k_prompt = get_task("gsm8k").prompt(problem)
    assert "number" in gsm8k_prompt and "\\boxed" not in gsm8k_prompt
    assert get_task("svamp").prompt(problem) == gsm8k_prompt  # SVAMP uses GSM8K's prompt
    assert get_task("arithmetic").prompt(problem) == gsm8k_prompt
    csqa_prompt = get_task("csqa").prompt(Problem("c", "Where is money kept?", "A",
                                                  choices=CHOICES))
    for label, text in CHOICES:
        assert f"\n{label}. {text}" in csqa_prompt
    assert "Answer: <letter>" in csqa_prompt


def test_gold_targets() -> None:
    assert get_task("csqa").gold_target(Problem("c", "q", "B", choices=CHOICES)) == "Answer: B"
    gsm = Problem("g", "q", "9", solution="16 - 7 = <<16-7=9>>9 eggs.\n#### 9")
    assert get_task("gsm8k").gold_target(gsm) == "16 - 7 = 9 eggs.\nThe answer is 9."


def test_arithmetic_splits_are_deterministic_disjoint_and_verifiable() -> None:
    train = load_problems("arithmetic", "train")  # no data directory needed
    evals = load_problems("arithmetic", "eval", None)
    assert (len(train), len(evals)) == (1000, 200)
    assert train == load_problems("arithmetic", "train")
    assert train[17].id == "arith-train-00017" and evals[0].id == "arith-eval-00000"
    assert not {p.question for p in train} & {p.question for p in evals}
    assert len({p.question for p in train}) == 1000
    task = get_task("arithmetic")
    for problem in train[:50] + evals[:50]:
        assert re.fullmatch(r"\d+", problem.answer)
        assert task.verify(task.gold_target(problem), problem).correct
        assert task.reward(f"The answer is {int(problem.answer) + 1}.", problem) == 0.0


def test_arithmetic_difficulty_knob() -> None:
    def two_step_share(level: int) -> float:
        problems = generate_problems("train", 300, difficulty=level)
        return sum(p.solution.count("=") >= 2 for p in problems) / len(problems)

    assert two_step_share(1) == two_step_share(2) == two_step_share(3) == 0.0
    assert 0.3 < two_step_share(4) < 0.7
    assert two_step_share(5) == 1.0
    easiest = generate_problems("train", 300, difficulty=1)
    assert all(" + " in p.solution and int(p.answer) <= 10 for p in easiest)
    assert max(int(p.answer) for p in generate_problems("train", 300, difficulty=3)) > 20
    with pytest.raises(ConfigError):
        generate_problems("train", 10, difficulty=9)


def test_custom_arithmetic_task_sizes() -> None:
    task = make_arithmetic_task(5, n_train=50, n_eval=20)
    train = load_problems(task, "train")
    evals = load_problems(task, "eval")
    assert (len(train), len(evals)) == (50, 20)
    assert not {p.question for p in train} & {p.question for p in evals}
    assert all(p.solution.count("=") >= 2 for p in train)
    with pytest.raises(ConfigError, match="generated offline"):
        load_problems("arithmetic", "eval", source="hub")


def test_every_arithmetic_level_is_a_registered_task() -> None:
    """``arithmetic`` is level 1, ``arithmetic-hard`` level 4, ``arithmetic-N`` the others:
    each name loads exactly that level's problems."""
    names = {1: "arithmetic", 2: "arithmetic-2", 3: "arithmetic-3", 4: "arithmetic-hard",
             5: "arithmetic-5"}
    for level, name in names.items():
        assert [p.question for p in load_problems(name, "train")[:20]] == [
            p.question for p in generate_problems("train", 20, difficulty=level)]
        evals = load_problems(name, "eval")
        assert len(evals) == 200 and evals[0].id == "arith-eval-00000"


def test_the_proxy_is_level_one_under_other_public_seeds() -> None:
    """``arithmetic-proxy`` draws level 1 from seeds that ``arithmetic`` does not use, with
    names and items of its own: no question of it is in ``arithmetic`` by the public-data rule
    (issue 56: with the same names and items, 189 of its 1,000 training questions were word
    for word in ``arithmetic``'s training split, 628 by the 13-word rule); its eval split is
    disjoint from its own train split, every problem level 1."""
    from dpgrpo.privacy.public_data import question_overlap
    from dpgrpo.tasks.arithmetic import PROXY_SEEDS, SEEDS

    assert not set(PROXY_SEEDS.values()) & set(SEEDS.values())
    train, evals = load_problems("arithmetic-proxy", "train"), load_problems("arithmetic-proxy",
                                                                             "eval")
    assert [p.question for p in train[:20]] == [
        p.question for p in generate_problems("train", 20, seed=2, difficulty=1,
                                              vocabulary="proxy")]
    private = [p.question for s in ("train", "eval") for p in load_problems("arithmetic", s)]
    assert question_overlap([p.question for p in train + evals], private).count == 0
    old = question_overlap([p.question for p in generate_problems("train", seed=2, difficulty=1)],
                           [p.question for p in load_problems("arithmetic", "train")])
    assert (old.count, old.exact, old.total) == (628, 189, 1000)
    assert [p.question for p in train] != [p.question for p in load_problems("arithmetic",
                                                                              "train")]
    assert len(train) == 1000 and len(evals) == 200
    assert not {p.question for p in train} & {p.question for p in evals}
    assert all(4 <= int(p.answer) <= 10 for p in train)       # two numbers from 2 to 5
