"""CommonsenseQA (Talmor et al., 2019): five-way multiple choice.

Files: ``csqa/dev_rand_split.jsonl`` (the validation split, which is the evaluation set since
test labels are not public) and, if present, ``csqa/train_rand_split.jsonl``; records have
``id``, ``question``, ``choices`` (``label``/``text`` lists) and ``answerKey``. The training
split is not in the shared data folder; load it with ``source="hub"``. The strict verifier
reads one letter from ``Answer: <letter>`` declarations; ``final`` is the Appendix E-B
final-answer rescore.
"""

from __future__ import annotations

from collections.abc import Mapping

from dpgrpo.tasks.base import Problem, VerifiedTask, register_task
from dpgrpo.tasks.records import Row
from dpgrpo.tasks.sources import Source

CSQA_PROMPT = (
    "{question}\n\n{options}\n\n"
    "Choose the best option. Explain briefly, then end your response with a line of the "
    "form \"Answer: <letter>\"."
)


def csqa_prompt(problem: Problem) -> str:
    """The question, the five options as ``A. text`` lines, and the declaration request."""
    options = "\n".join(f"{label}. {text}" for label, text in problem.choices or ())
    return CSQA_PROMPT.format(question=problem.question.strip(), options=options)


def gold_declaration(problem: Problem) -> str:
    """The gold-SFT target: the declaration ``Answer: <gold letter>`` (Sec. VII-C)."""
    return f"Answer: {problem.answer}"


def _choices(row: Row) -> tuple[tuple[str, str], ...]:
    raw = row.value("choices")
    if not isinstance(raw, Mapping):
        raise row.error("expected an object with 'label' and 'text' lists", "choices")
    labels, texts = raw.get("label"), raw.get("text")
    if not isinstance(labels, list) or not isinstance(texts, list) or len(labels) != len(texts):
        raise row.error("'label' and 'text' must be lists of equal length", "choices")
    if len(labels) < 2:
        raise row.error(f"expected several options, got {len(labels)}", "choices")
    for label, text in zip(labels, texts):
        if not isinstance(label, str) or not label.strip():
            raise row.error(f"bad option label {label!r}", "choices")
        if not isinstance(text, str) or not text.strip():
            raise row.error(f"empty text for option {label!r}", "choices")
    if len(set(labels)) != len(labels):
        raise row.error("duplicate option labels", "choices")
    return tuple((label.strip(), text.strip()) for label, text in zip(labels, texts))


def _parse(row: Row, index: str) -> Problem:
    choices = _choices(row)
    answer = row.text("answerKey").strip()
    if answer not in {label for label, _ in choices}:
        raise row.error(f"answer {answer!r} is not one of the option labels", "answerKey")
    return Problem(row.text("id").strip(), row.text("question"), answer, choices=choices)


TRAIN = Source("csqa", "train_rand_split.jsonl", "tau/commonsense_qa", None, ("train",), _parse)
VALIDATION = Source("csqa", "dev_rand_split.jsonl", "tau/commonsense_qa", None,
                    ("validation",), _parse)

CSQA = register_task(VerifiedTask(
    name="csqa",
    default_max_new_tokens=512,
    render_prompt=csqa_prompt,
    render_gold=gold_declaration,
    scorer_names={"strict": "csqa_letter", "final": "csqa_final"},
    splits={"train": TRAIN.load, "eval": VALIDATION.load, "validation": VALIDATION.load},
    description="CommonsenseQA; eval = the 1,221-question validation split",
))
