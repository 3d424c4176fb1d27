"""MATH (Hendrycks et al., 2021): competition problems with a ``\\boxed{}`` answer.

Files: ``math/{train,test}.jsonl`` (``problem``, ``level``, ``type``, ``solution``) and
``math/math500_test.jsonl`` (the MATH-500 subset: ``question``, ``answer`` = solution text).
The evaluation split (Appendix C-C) is the test split minus the MATH-500 problems minus test
problems that also appear in the training split, matched by whitespace-normalized problem
text: 5,000 - 500 - 1 = 4,499 problems. The reference answer is the last boxed expression of
the reference solution; the strict verifier is symbolic equality of the last boxed answer.
"""

from __future__ import annotations

from pathlib import Path

from dpgrpo.errors import DataError
from dpgrpo.tasks.base import LoadedSplit, Problem, VerifiedTask, register_task
from dpgrpo.tasks.extract import last_boxed
from dpgrpo.tasks.records import Row, normalize_text
from dpgrpo.tasks.sources import Source

MATH_PROMPT = (
    "{question}\n\n"
    "Solve the problem step by step. Put your final answer within \\boxed{{}}."
)


def math_prompt(problem: Problem) -> str:
    """The user message asking for a boxed final answer."""
    return MATH_PROMPT.format(question=problem.question.strip())


def gold_solution(problem: Problem) -> str:
    """The reference solution (its last box is the answer), or the boxed answer alone."""
    return problem.solution if problem.solution else f"\\boxed{{{problem.answer}}}"


def _parse(split: str, question_field: str = "problem", solution_field: str = "solution"):
    def parse(row: Row, index: str) -> Problem:
        question = row.text(question_field)
        solution = row.text(solution_field)
        answer = last_boxed(solution)
        if answer is None:
            raise row.error("unparsable reference: no complete \\boxed{} answer", solution_field)
        if not answer.strip():
            raise row.error("empty answer in \\boxed{}", solution_field)
        return Problem(f"math-{split}-{index}", question, answer, solution=solution)

    return parse


HUB = "DigitalLearningGmbH/MATH-lighteval"
TRAIN = Source("math", "train.jsonl", HUB, "default", ("train",), _parse("train"))
TEST = Source("math", "test.jsonl", HUB, "default", ("test",), _parse("test"))
MATH500 = Source("math", "math500_test.jsonl", "HuggingFaceH4/MATH-500", None, ("test",),
                 _parse("math500", "question", "answer"))
_MATH500_HUB = Source("math", "math500_test.jsonl", "HuggingFaceH4/MATH-500", None, ("test",),
                      _parse("math500", "problem", "solution"))


def load_math500(data_dir: str | Path | None, *, skip_invalid: bool = False,
                 source: str = "local") -> LoadedSplit:
    """The MATH-500 problems (the local file names its fields ``question``/``answer``)."""
    return (_MATH500_HUB if source == "hub" else MATH500).load(
        data_dir, skip_invalid=skip_invalid, source=source)


def _problem_texts(src: Source, field: str, data_dir: str | Path | None, *,
                   skip_invalid: bool, source: str) -> tuple[set[str], list[DataError]]:
    """Normalized problem texts of a file used only for exclusion (answers not needed)."""
    texts: set[str] = set()
    skipped: list[DataError] = []
    for label, records in src.records(data_dir, source):
        for line, obj in records:
            try:
                if isinstance(obj, DataError):
                    raise obj
                texts.add(normalize_text(Row(obj, label, line).text(field)))
            except DataError as err:
                if not skip_invalid:
                    raise
                skipped.append(err)
    return texts, skipped


def load_eval(data_dir: str | Path | None, *, skip_invalid: bool = False,
              source: str = "local") -> LoadedSplit:
    """The 4,499-problem evaluation set: test - MATH-500 - problems also in train."""
    test = TEST.load(data_dir, skip_invalid=skip_invalid, source=source)
    hub = source == "hub"
    math500, skipped_500 = _problem_texts(_MATH500_HUB if hub else MATH500,
                                          "problem" if hub else "question", data_dir,
                                          skip_invalid=skip_invalid, source=source)
    train, skipped_train = _problem_texts(TRAIN, "problem", data_dir,
                                          skip_invalid=skip_invalid, source=source)
    kept, in_math500, in_train = [], 0, 0
    for problem in test.problems:
        text = normalize_text(problem.question)
        if text in math500:
            in_math500 += 1
        elif text in train:
            in_train += 1
        else:
            kept.append(problem)
    return LoadedSplit(kept, (*test.skipped, *skipped_500, *skipped_train),
                       {"excluded_math500": in_math500, "excluded_duplicates": in_train})


MATH = register_task(VerifiedTask(
    name="math",
    default_max_new_tokens=1024,
    render_prompt=math_prompt,
    render_gold=gold_solution,
    scorer_names={"strict": "math_boxed", "robust": "math_robust"},
    splits={"train": TRAIN.load, "eval": load_eval, "test": TEST.load, "math500": load_math500},
    description="MATH; eval = test - MATH-500 - train duplicates (4,499 problems)",
))
