"""SVAMP (Patel et al., 2021): 1,000 arithmetic word problems, used only to evaluate GSM8K
checkpoints (Appendix D-D) with GSM8K's prompt, cap and final-number verifier.

File: ``svamp/SVAMP.json``, a JSON array of ``ID``, ``Body``, ``Question``, ``Equation``,
``Answer`` (a number), ``Type``. The question is ``Body`` followed by ``Question``.
"""

from __future__ import annotations

import math
from decimal import Decimal

from dpgrpo.tasks.base import Problem, VerifiedTask, register_task
from dpgrpo.tasks.extract import canonical_number
from dpgrpo.tasks.gsm8k import answer_sentence, number_prompt
from dpgrpo.tasks.records import Row
from dpgrpo.tasks.sources import Source


def _parse(row: Row, index: str) -> Problem:
    raw_id = row.value("ID")
    if not isinstance(raw_id, str | int) or not str(raw_id).strip():
        raise row.error("expected a nonempty id", "ID")
    question = f"{row.text('Body').strip()} {row.text('Question').strip()}"
    value = row.value("Answer")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise row.error(f"expected a number, got {type(value).__name__}", "Answer")
    if isinstance(value, str) and not value.strip():
        raise row.error("empty answer", "Answer")
    if isinstance(value, float) and not math.isfinite(value):
        raise row.error(f"unparsable reference: {value!r}", "Answer")
    text = format(Decimal(repr(value)), "f") if isinstance(value, float) else str(value)
    answer = canonical_number(text)
    if answer is None:
        raise row.error(f"unparsable reference: {value!r} is not a number", "Answer")
    return Problem(str(raw_id).strip(), question, answer)


ALL = Source("svamp", "SVAMP.json", "ChilleD/SVAMP", None, ("train", "test"), _parse)

SVAMP = register_task(VerifiedTask(
    name="svamp",
    default_max_new_tokens=512,
    render_prompt=number_prompt,
    render_gold=lambda problem: answer_sentence(problem.answer),
    scorer_names={"strict": "final_number"},
    splits={"eval": ALL.load},
    description="SVAMP transfer check for GSM8K checkpoints (1,000 problems)",
))
