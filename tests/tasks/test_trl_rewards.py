"""TRL-shaped data and reward functions: a ``prompt`` column (text or conversational, under
the chat template as TRL applies it), bad rows named by row and field, TRL reward functions
called on ONE prompt's G completions with that prompt's columns only, reward_weights and
None as TRL's nansum."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError, DataError
from dpgrpo.rollout.batch import chat_prompt_ids, chat_text, completion_ids
from dpgrpo.tasks import make_task
from dpgrpo.tasks.trl_rewards import TRLReward, is_trl_reward, record_columns, trl_reward
from dpgrpo.training.arms import make_arm
from dpgrpo.verify.fixtures import build_tiny_tokenizer, synthetic_rollouts

G = 3
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
ROWS = [{"prompt": CHAT, "solution": "4", "level": 1},
        {"prompt": "What is 3 + 4?", "solution": "7", "level": 2},
        {"prompt": [{"role": "user", "content": "1 + 1?"}], "solution": "2", "level": 3}]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_conversational_prompts_get_the_chat_template_as_trl_applies_it(tok):
    task = make_task(ROWS, lambda c, p: 0.0)
    problems = task.load_split("train").problems
    assert [p.question for p in problems] == ["2 + 2?", "What is 3 + 4?", "1 + 1?"]
    assert task.prompt(problems[0]) == CHAT and task.prompt(problems[1]) == "What is 3 + 4?"
    assert chat_text(tok, task.prompt(problems[0])) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert chat_text(tok, "What is 3 + 4?") == tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], tokenize=False, add_generation_prompt=True)
    prefill = [*CHAT, {"role": "assistant", "content": "The answer is"}]
    assert chat_text(tok, prefill).endswith("<|im_start|>assistant\nThe answer is")  # continued
    ids = chat_prompt_ids(tok, [task.prompt(p) for p in problems])
    assert tok.decode(ids[0]) == chat_text(tok, CHAT)


@pytest.mark.parametrize("prompt,field,needle", [
    ([], "prompt", "nonempty list"),
    ({"role": "user"}, "prompt", "nonempty list"),
    (["hi"], "prompt[0]", "message, got str"),
    ([{"role": "user", "content": 3}], "prompt[0].content", "expected a string, got int"),
    ([{"content": "x"}], "prompt[0].role", "expected a string, got NoneType"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "prompt[1].role",
     "last message must be a user turn"),
    ([{"role": "system", "content": "only"}, {"role": "user", "content": " "}], "prompt",
     "a user message with text"),
    ("  ", "prompt", "missing or empty"),
])
def test_bad_rows_name_row_and_field(prompt, field, needle):
    rows = [{"prompt": "fine"}, {"prompt": prompt, "answer": "1"}]
    with pytest.raises(DataError, match=rf"problems, line 2, field '{re.escape(field)}'.*{needle}"):
        make_task(rows, lambda c, p: 0.0)


def test_prompt_wins_over_question_and_datasets_rows_work():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": CHAT, "question": "ignored", "answer": "4"}])
    task = make_task(ds, lambda c, p: 0.0)
    (problem,) = task.load_split("train").problems
    assert problem.question == "2 + 2?" and task.prompt(problem) == CHAT


def test_trl_signatures_are_recognised():
    def trl_style(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    def dpgrpo_style(completion, problem):
        return 0.0

    assert is_trl_reward(trl_style) and is_trl_reward(lambda completions, **kw: [])
    assert not is_trl_reward(dpgrpo_style) and not is_trl_reward(print)
    marked = trl_reward(lambda *a, **kw: [1.0])
    assert isinstance(marked, TRLReward) and is_trl_reward(marked) and trl_reward(marked) is marked
    task = make_task([{"prompt": "x"}], [trl_style, dpgrpo_style])
    assert isinstance(task.reward_fns[0], TRLReward) and task.reward_fns[1] is dpgrpo_style
    with pytest.raises(ConfigError, match="names a reward model"):
        make_task([{"prompt": "x"}], "org/reward-model")
    assert record_columns({"prompt": "p", "completion": "c", "a": 1}) == {"a": 1}


class _Engine:
    """Rollouts whose texts say which prompt and row they are."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, messages, *, group_size, **_):
        batch = synthetic_rollouts(self.tok, len(messages), group_size)
        batch.texts = [[f"p{i} r{r}" for r in range(group_size)] for i in range(len(messages))]
        return batch


def test_each_call_sees_one_prompts_completions_and_columns(tok):
    """A spy reward: every call holds the G completions of one prompt, that prompt G times and
    its own columns G times; completion_ids are its rows' tokens. Weights and None: TRL's
    weighted nansum (None adds nothing)."""
    calls = []

    def spy(prompts, completions, completion_ids=None, **columns):
        calls.append((prompts, completions, completion_ids, columns))
        return [float(_row(c) == 0) for c in completions]

    def sometimes_none(prompts, completions, **columns):
        return [None if _row(c) == 1 else 0.5 for c in completions]

    def _row(completion):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        return int(text.split()[1][1:])

    task = make_task(ROWS, [spy, sometimes_none], reward_weights=[2.0, -1.0])
    problems = task.load_split("train").problems
    cfg = apply_overrides(embedded_default(), [f"train.group_size={G}", "train.beta=0",
                                               "train.max_new_tokens=7"])
    arm = make_arm(cfg, SimpleNamespace(model=object(), tokenizer=tok), task)
    arm._engine = _Engine(tok)
    rollouts, rewards = arm._rollouts([(task, p) for p in problems], None, None)
    assert rewards.tolist() == [[1.5, 0.0, -0.5]] * 3                   # 2*1 - 0.5; 0 + None
    assert len(calls) == 3                                              # one call per prompt
    for i, (prompts, completions, ids, columns) in enumerate(calls):
        assert prompts == [ROWS[i]["prompt"]] * G
        texts = [f"p{i} r{r}" for r in range(G)]
        if isinstance(ROWS[i]["prompt"], str):
            assert completions == texts
        else:                                                           # conversational
            assert completions == [[{"role": "assistant", "content": t}] for t in texts]
        assert columns == {"solution": [ROWS[i]["solution"]] * G, "level": [ROWS[i]["level"]] * G}
        assert ids == completion_ids(rollouts, i) and len(ids) == G
        assert ids[0] == rollouts.input_ids[i * G][rollouts.completion_mask[i * G].bool()].tolist()
    assert task.reward("p0 r0", problems[2]) == 1.5                     # one completion alone
    assert calls[-1][2] is None and calls[-1][1] == [[{"role": "assistant", "content": "p0 r0"}]]


def test_a_trl_reward_must_return_one_value_per_completion():
    task = make_task([{"prompt": "x"}], lambda prompts, completions, **kw: [1.0, 2.0])
    (problem,) = task.load_split("train").problems
    with pytest.raises(ConfigError, match="returned 2 values for one prompt's 3 completions"):
        task.group_rewards(["a", "b", "c"], problem)
    nan = make_task([{"prompt": "x"}], [lambda completions, **kw: [math.nan, math.inf, None],
                                        lambda completion, problem: None])
    assert nan.group_rewards(["a", "b", "c"], problem) == [0.0, 0.0, 0.0]


def _broken_trl(prompts, completions, **kwargs):
    raise KeyError("solution")


def _broken_dpgrpo(completion, problem):
    return 1.0 / 0


@pytest.mark.parametrize("fn, where, what", [
    (_broken_trl, f"{__name__}._broken_trl", "KeyError: 'solution'"),
    (_broken_dpgrpo, f"{__name__}._broken_dpgrpo", "ZeroDivisionError: float division by zero"),
])
def test_a_raising_reward_is_one_user_code_error_naming_it(fn, where, what):
    """Issue 33: either convention's exception becomes one line (the trainer adds the round)."""
    from dpgrpo.errors import UserCodeError

    task = make_task([{"prompt": "x"}], fn)
    (problem,) = task.load_split("train").problems
    with pytest.raises(UserCodeError) as info:
        task.group_rewards(["a", "b"], problem)
    assert f"reward function {where} raised {what}" in str(info.value)
    assert "\n" not in str(info.value)


def test_problem_records_and_canaries_give_their_fields_as_columns():
    from dpgrpo.tasks import Problem

    seen = {}

    def reward(prompts, completions, **columns):
        seen.update(columns)
        return [1.0] * len(completions)

    task = make_task([Problem("a", "q?", "7", solution="s")], reward)
    outsider = Problem("canary-1", "c?", "9")                            # not in the records
    assert task.group_rewards(["x"], outsider) == [1.0]
    assert seen["answer"] == ["9"] and seen["id"] == ["canary-1"] and "question" not in seen
    assert torch.tensor(task.group_rewards(["x", "y"], outsider)).shape == (2,)


def test_a_conversational_prompt_round_trips_in_predictions():
    from dpgrpo.evaluation.predictions import Prediction
    from dpgrpo.tasks import Verdict

    row = Prediction("a", "4", 1, False, {"strict": Verdict(True, "4")}, prompt=CHAT).to_json()
    back = Prediction.from_json(row, "predictions.jsonl", 1)
    assert back.prompt == CHAT
    with pytest.raises(DataError, match="field 'prompt': expected a string or a conversation"):
        Prediction.from_json({**row, "prompt": 3}, "predictions.jsonl", 1)
