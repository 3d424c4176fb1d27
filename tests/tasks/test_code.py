"""Code tasks: extraction, the procedural ``code`` task, HumanEval from the package, and the
training reward on hostile completions."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import pytest

from dpgrpo.tasks import get_task, load_problems, task_names
from dpgrpo.tasks.code import CODE_TIMEOUT_S, extract_code, generate_code_problems, unit_tests


def test_code_tasks_are_registered():
    assert {"code", "humaneval"} <= set(task_names())
    for name in ("code", "humaneval"):
        task = get_task(name)
        scorer = task.scorers()["strict"]
        # the sandbox bounds itself: no signal-based bounded_score wrapper around it
        assert isinstance(scorer, functools.partial) and scorer.func is unit_tests
        assert scorer.keywords == {"timeout_s": CODE_TIMEOUT_S}
    assert get_task("code", check_timeout_s=9).scorers()["strict"].keywords["timeout_s"] == 9


@pytest.mark.parametrize("response, code", [
    ("Here:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x"),
    ("```py\nA = 1\n```\n```python\nB = 2\n```", "A = 1"),           # the first block
    ("```\nx = 1\n```", "x = 1"),                                       # unlabelled fence
    ("Sure!\n```python\ndef f(x):\n    return", "def f(x):\n    return"),  # cut at the cap
    ("def f(x):\n    return x\n", "def f(x):\n    return x"),           # no fence: all of it
    ("```js\nlet a;\n```\n```python\nok = 1\n```", "ok = 1"),          # other languages skipped
])
def test_extract_code(response, code):
    assert extract_code(response) == code


def test_procedural_code_task_is_deterministic_disjoint_and_verifiable():
    train = load_problems("code", "train")
    evals = load_problems("code", "eval")
    assert len(train) == 1000 and len(evals) == 200
    assert train[17].id == "code-train-00017" and generate_code_problems("train", 20) == train[:20]
    assert not {p.question for p in train} & {p.question for p in evals}
    task = get_task("code")
    sample = evals[:12]
    with ThreadPoolExecutor(2) as pool:
        gold = list(pool.map(lambda p: task.reward(task.gold_target(p), p), sample))
        bare = list(pool.map(lambda p: task.reward(f"```python\n{p.question}```", p), sample))
    assert gold == [1.0] * 12 and bare == [0.0] * 12
    problem = evals[0]
    assert task.gold_target(problem) == f"```python\n{problem.solution.rstrip()}\n```"
    assert problem.question in task.prompt(problem) and "```python" in task.prompt(problem)


def test_humaneval_loads_from_the_package_and_its_canonical_solutions_pass():
    problems = load_problems("humaneval", "eval")
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    assert problems[163].id == "HumanEval/163" and len({p.id for p in problems}) == 164
    assert all(p.answer.rstrip().endswith(")") and "def check(candidate)" in p.answer
               for p in problems)
    task = get_task("humaneval")
    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(lambda p: task.verify(task.gold_target(p), p), problems))
    assert [p.id for p, v in zip(problems, verdicts) if not v.correct] == []
    assert task.verify("```python\n" + problems[0].question + "```", problems[0]).correct is False


def test_the_training_reward_scores_hostile_completions_zero():
    task = get_task("code", check_timeout_s=1.0)
    problem = load_problems("code", "eval")[0]
    name = problem.question.split("(")[0].removeprefix("def ")
    hostile = {
        "loop": f"```python\ndef {name}(*a):\n    while True:\n        pass\n```",
        "system": f"```python\nimport os\nos.system('ls')\n```\n{task.gold_target(problem)}",
        "memory": f"```python\ndef {name}(*a):\n    return [0] * 10**10\n```",
        "passwd": f"```python\nopen('/etc/passwd').read()\n{problem.solution}```",
        "prose": "I cannot write this function.",
        "empty": "",
    }
    verdicts = {k: task.verify(v, problem) for k, v in hostile.items()}
    assert {k: task.reward(v, problem) for k, v in hostile.items()} == dict.fromkeys(hostile, 0.0)
    assert verdicts["loop"].timed_out and not verdicts["memory"].timed_out
    assert verdicts["empty"].extracted is None and verdicts["prose"].extracted is not None
    assert task.reward(task.gold_target(problem), problem) == 1.0


def test_a_training_run_on_the_code_task_verifies_in_the_sandbox(tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    """The trainer runs the code task end to end: every completion of the tiny random model is
    scored (0) by the sandboxed verifier, and the round still takes its noisy step."""
    import json

    import dpgrpo.tasks.code as code
    from dpgrpo.config import apply_overrides, embedded_default
    from dpgrpo.training.trainer import train

    statuses = []
    original = code.run_tests

    def spy(program, tests, limits, **kwargs):
        result = original(program, tests, limits, **kwargs)
        statuses.append(result.status)
        return result

    monkeypatch.setattr(code, "run_tests", spy)
    cfg = apply_overrides(embedded_default(), [
        f"model.name={tiny_model_dir}", "model.device=cpu", "data.task=code", "data.limit=20",
        "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=2",
        "train.group_size=2", "train.max_new_tokens=8", "train.checkpoint_every=1",
        "privacy.seed=3"])
    result = train(cfg, tmp_path / "run")
    assert result.certificate["task"] == "code" and result.certificate["rounds_charged"] == 2
    rows = [json.loads(x) for x in
            (tmp_path / "run" / "recovery" / "telemetry.jsonl").read_text().splitlines()]
    completions = sum(2 * r["batch_size"] for r in rows)
    assert 0 < len(statuses) <= completions and "passed" not in statuses
    assert all(r["reward_mean"] == 0 for r in rows if r["batch_size"])
