"""GSM8K (Cobbe et al., 2021): grade-school word problems with a final-number answer.

Files: ``gsm8k/{train,test}.jsonl`` with ``question`` and ``answer`` (a worked solution with
``<<calculator>>`` annotations, ending ``#### <number>``). The evaluation split is the full
1,319-problem test split (Appendix C-C). The strict verifier reads the final number.
"""

from __future__ import annotations

import re

from dpgrpo.tasks.base import Problem, VerifiedTask, register_task
from dpgrpo.tasks.extract import canonical_number
from dpgrpo.tasks.records import Row
from dpgrpo.tasks.sources import Source

#: GSM8K's prompt (also SVAMP's and the embedded arithmetic task's).
NUMBER_PROMPT = (
    "{question}\n\n"
    "Solve the problem step by step. Then write the final answer as a single number "
    "on the last line, in the form \"The answer is <number>.\""
)

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def number_prompt(problem: Problem) -> str:
    """The user message asking for a final number."""
    return NUMBER_PROMPT.format(question=problem.question.strip())


def answer_sentence(answer: str) -> str:
    """The closing sentence of a gold target."""
    return f"The answer is {answer}."


def gold_solution(problem: Problem) -> str:
    """GSM8K's worked solution without calculator annotations, ending with the answer."""
    if problem.solution is None:
        return answer_sentence(problem.answer)
    body = _CALCULATOR.sub("", problem.solution.rsplit("####", 1)[0]).rstrip()
    return f"{body}\n{answer_sentence(problem.answer)}" if body else answer_sentence(problem.answer)


def _parse(split: str):
    def parse(row: Row, index: str) -> Problem:
        question = row.text("question")
        solution = row.text("answer")
        if "####" not in solution:
            raise row.error("unparsable reference: no '#### <number>' final answer", "answer")
        final = solution.rsplit("####", 1)[1].strip()
        if not final:
            raise row.error("empty answer after '####'", "answer")
        answer = canonical_number(final)
        if answer is None:
            raise row.error(f"unparsable reference: {final!r} is not a number", "answer")
        return Problem(f"gsm8k-{split}-{index}", question, answer, solution=solution)

    return parse


def _source(split: str, filename: str, hub_split: str) -> Source:
    return Source("gsm8k", filename, "openai/gsm8k", "main", (hub_split,), _parse(split))


TRAIN = _source("train", "train.jsonl", "train")
TEST = _source("test", "test.jsonl", "test")

GSM8K = register_task(VerifiedTask(
    name="gsm8k",
    default_max_new_tokens=512,
    render_prompt=number_prompt,
    render_gold=gold_solution,
    scorer_names={"strict": "final_number"},
    splits={"train": TRAIN.load, "eval": TEST.load, "test": TEST.load},
    description="GSM8K grade-school math; eval = the 1,319-problem test split",
))
