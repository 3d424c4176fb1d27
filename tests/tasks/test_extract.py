"""Text extractors: boxed answers, final numbers and option letters."""

from __future__ import annotations

import pytest

from dpgrpo.tasks.extract import boxed_answers, canonical_number, final_number, last_boxed
from dpgrpo.tasks.letters import final_letter, strict_letter


@pytest.mark.parametrize("text, expected", [
    ("so $\\boxed{5}$.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
    ("\\boxed{\\left\\{ x \\right\\}}", "\\left\\{ x \\right\\}"),
    ("\\boxed{a_{b_{c}}}", "a_{b_{c}}"),  # nested groups
    ("first \\boxed{3}, then \\boxed{4}", "4"),  # the last box
    ("\\fbox{7}", "7"),
    ("\\boxed 9 is it", "9"),
    ("\\boxed{3} and then \\boxed{4", "3"),  # an unterminated box is not an answer
    ("no box here", None),
    ("\\boxed{", None),
    ("\\boxedx{3}", None),
])
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_boxed_answers_keeps_order_and_count() -> None:
    assert boxed_answers("\\boxed{1} \\boxed{{2}} \\boxed{3}") == ["1", "{2}", "3"]


@pytest.mark.parametrize("text, expected", [
    ("18", "18"), ("18.00", "18"), ("$1,234.50.", "1234.5"), ("-7", "-7"), ("+3", "3"),
    (".5", "0.5"), ("1,000,000", "1000000"), ("0.0", "0"), ("\\$5", "5"),
    ("12a", None), ("", None), ("1/2", None), ("--3", None),
])
def test_canonical_number(text: str, expected: str | None) -> None:
    assert canonical_number(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is 42.", "42"),
    ("She pays $1,250.", "1250"),
    ("Total: 3 + 4 = 7 apples", "7"),
    ("5-3=2", "2"),  # a hyphen after a digit is not a minus sign
    ("It falls to -5 degrees", "-5"),
    ("x_1 is the unknown", None),  # a subscript is not a number
    ("the value 2.50.", "2.5"),
    ("no digits at all", None),
])
def test_final_number(text: str, expected: str | None) -> None:
    assert final_number(text) == expected


CHOICES = (("A", "bank"), ("B", "library"), ("C", "mall"), ("D", "park"), ("E", "zoo"))


@pytest.mark.parametrize("text, strict, final", [
    ("Answer: B", "B", "B"),
    ("**Answer:** (B)", "B", "B"),
    ("answer: B.", "B", "B"),
    ("Answer: [B] library", "B", "B"),
    ("Answer: B or C", None, None),  # one declaration naming two letters
    ("Answer: B/C", None, None),
    ("Answer: A\nOn reflection...\nAnswer: B", None, "B"),  # conflicting declarations
    ("Answer: B\nSo, Answer: B", "B", "B"),  # repeated, consistent
    ("The answer is B.", None, "B"),  # not the strict format
    ("The correct option is (D).", None, "D"),
    ("Answer: Bank", None, "A"),  # a word starting with B is not the letter B
    ("Answer: library", None, "B"),
    ("Answer: shop", None, None),
    ("B", None, None),
    ("I like option C. A bank? Hmm.", None, None),
])
def test_option_letters(text: str, strict: str | None, final: str | None) -> None:
    assert strict_letter(text) == strict
    assert final_letter(text, CHOICES) == final


# --- adversarial inputs: extraction is linear and the whole scorer is bounded ------------

NESTED = "\\boxed{" * 12_500 + "1" + "}" * 12_500        # 100,001 characters
UNTERMINATED = "\\boxed{" * 50_000


def _reference_boxed_answers(text: str) -> list[str]:
    """The original (quadratic) definition: rescan from every box to its closing brace."""
    import re

    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\b\s*", text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            depth, i, end = 0, start, None
            while i < len(text):
                if text[i] == "\\":
                    i += 2
                    continue
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if text[i] == "}" and depth == 0:
                    end = i + 1
                    break
                i += 1
            if end is not None:
                found.append(text[start + 1:end - 1].strip())
        else:
            token = re.match(r"[^\s$\\]+", text[start:])
            if token:
                found.append(token.group(0))
    return found


def test_one_pass_extraction_matches_the_original_definition() -> None:
    import random

    rng = random.Random(16)
    pieces = ["\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "\\{", "\\}", "x", "1", " ", "$",
              "\\", "\\frac{1}{2}", "\\boxedx{"]
    from dpgrpo.tasks.extract import MAX_BOX_DEPTH

    checked = 0
    while checked < 3000:
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        if text.count("\\boxed{") + text.count("\\fbox{") > MAX_BOX_DEPTH:
            continue  # deeper nesting is capped on purpose (next test)
        assert boxed_answers(text) == _reference_boxed_answers(text), text
        checked += 1


def test_boxes_nested_too_deep_are_skipped() -> None:
    from dpgrpo.tasks.extract import MAX_BOX_DEPTH

    text = "\\boxed{" * (MAX_BOX_DEPTH + 3) + "7" + "}" * (MAX_BOX_DEPTH + 3)
    answers = boxed_answers(text)
    assert len(answers) == MAX_BOX_DEPTH and answers[0] == text[7:-1]
    assert boxed_answers("\\boxed{" * 3 + "7" + "}" * 3)[-1] == "7"


@pytest.mark.parametrize("text", [NESTED, UNTERMINATED], ids=["nested", "unterminated"])
def test_adversarial_answers_score_within_the_bound(text: str) -> None:
    import time

    from dpgrpo.tasks import Problem, get_task

    for task in ("math", "gsm8k", "svamp", "arithmetic", "csqa"):
        # a 600 s bound, so a check cut off at it fails the 60 s below: only linear work (or
        # a guard's refusal) answers in time, however loaded the machine
        spec = get_task(task, check_timeout_s=600)
        problem = Problem("p", "q", "A" if task == "csqa" else "1",
                          choices=(("A", "a"), ("B", "b")) if task == "csqa" else None)
        for role, scorer in spec.scorers().items():
            start = time.perf_counter()
            verdict = scorer(text, problem)
            assert time.perf_counter() - start < 60, (task, role)
            assert not (task == "math" and verdict.correct)
