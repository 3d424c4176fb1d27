"""Hand-written tables of tricky answers for every registered scorer."""

from __future__ import annotations

import time

import pytest

from dpgrpo.tasks import SCORERS, Problem, get_scorer, get_task

MATH = get_task("math")
GSM8K = get_task("gsm8k")
CSQA = get_task("csqa")


def math_problem(answer: str) -> Problem:
    return Problem("m", "q", answer, solution=f"... \\boxed{{{answer}}}")


# (gold, response) pairs that must be accepted by MATH's strict verifier.
MATH_EQUIVALENT = [
    ("\\frac12", "The answer is $\\boxed{\\frac{1}{2}}$."),
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("\\frac34", "\\boxed{\\dfrac{3}{4}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}"),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}"),
    ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
    ("-2, 3", "\\boxed{3, -2}"),
    ("5", "\\boxed{5\\text{ cm}}"),
    ("30^\\circ", "\\boxed{30}"),
    ("\\$18", "\\boxed{18}"),
    ("\\text{(C)}", "\\boxed{C}"),
    ("\\text{Monday}", "\\boxed{\\text{Monday}}"),
    ("8+4i", "\\boxed{4i+8}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi/2)}"),
    ("2^{100}", "\\boxed{1267650600228229401496703205376}"),
    ("4", "first \\boxed{3}, but no: \\boxed{4}"),  # the last box counts
]

# Near misses that must be rejected.
MATH_DIFFERENT = [
    ("(-\\infty, 3]", "\\boxed{(-\\infty, 3)}"),  # open vs closed end
    ("\\frac{1}{3}", "\\boxed{0.333}"),
    ("2", "\\boxed{-2}"),
    ("x+1", "\\boxed{x-1}"),
    ("2, 3", "\\boxed{2}"),
    ("3", "first \\boxed{3}, but no: \\boxed{4}"),
    ("\\text{east}", "\\boxed{\\text{west}}"),
    ("5", "The answer is 5."),  # unboxed: strict has no extraction
    ("5", "\\boxed{5"),  # cut inside the box
]


@pytest.mark.parametrize("gold, response", MATH_EQUIVALENT)
def test_math_strict_accepts_equivalent_forms(gold: str, response: str) -> None:
    verdict = MATH.verify(response, math_problem(gold))
    assert verdict.correct and not verdict.timed_out, verdict


@pytest.mark.parametrize("gold, response", MATH_DIFFERENT)
def test_math_strict_rejects_near_misses(gold: str, response: str) -> None:
    assert not MATH.verify(response, math_problem(gold)).correct


def test_math_strict_reports_what_it_read() -> None:
    verdict = MATH.verify("so \\boxed{\\dfrac{3}{4}}.", math_problem("3/4"))
    assert verdict.extracted == "\\dfrac{3}{4}"
    assert MATH.verify("no box", math_problem("1")).extracted is None


@pytest.mark.parametrize("response", [
    "\\boxed{10^{10^{10}}}",
    "\\boxed{9^{9^{9}}}",
    "\\boxed{(10^{10})^{10^{10}}}",
    "\\boxed{10000000!}",
    "\\boxed{x^{10^{12}}}",
    "\\boxed{" + "1" * 3000 + "}",
    "\\boxed{" + "{" * 500 + "5" + "}" * 500 + "}",  # nesting that stalls the parser
    "\\boxed{" + "(" * 25 + "1" + ")" * 25 + "}",
])
def test_math_guard_refuses_pathological_answers_fast(response: str) -> None:
    # a 600 s bound: only the guard (refusing before the check) answers within 60 s
    task = get_task("math", check_timeout_s=600)
    start = time.monotonic()
    verdict = task.verify(response, math_problem("1"))
    assert not verdict.correct and verdict.timed_out
    assert time.monotonic() - start < 60


def test_math_guard_lets_large_but_feasible_powers_through() -> None:
    verdict = MATH.verify("\\boxed{2^{2^{2^{2}}}}", math_problem("65536"))
    assert verdict.correct and not verdict.timed_out


def test_math_slow_check_times_out_and_counts_wrong() -> None:
    task = get_task("math", check_timeout_s=0.5)
    start = time.monotonic()
    verdict = task.verify("\\boxed{x^{20000}+1}", math_problem("(x+1)^{20000}"))
    assert (verdict.correct, verdict.timed_out) == (False, True)
    assert time.monotonic() - start < 60  # cut off at the bound, not run to the end
    assert task.reward("\\boxed{x^{20000}+1}", math_problem("(x+1)^{20000}")) == 0.0


@pytest.mark.parametrize("gold, response, expected", [
    ("\\frac12", "So the answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("5", "We solve it.\nTherefore, $x = 5$.", "5"),
    ("\\frac{5}{2}", "Thus x = 5/2.", "5/2"),
    ("2, 3", "The solutions are $x = 2$ or $x = 3$.", "2, 3"),  # both answers kept
    ("3", "Final Answer: The final answer is $3$. I hope it is correct.", "3"),
    ("42", "Some work.\n\n42\n", "42"),  # the final nonempty line
    ("25", "Therefore, the area is 25 square units.", "25"),
    ("\\text{(C)}", "The answer is (C).", "\\text{(C)}"),
    ("-3", "Substituting, we get $y=-3$.", "-3"),
])
def test_math_robust_reads_unboxed_final_answers(gold: str, response: str, expected: str) -> None:
    robust = MATH.scorers()["robust"]
    verdict = robust(response, math_problem(gold))
    assert verdict.correct and verdict.extracted == expected
    assert not MATH.verify(response, math_problem(gold)).correct  # strict does not
    assert robust(response, math_problem(gold), hit_cap=True).extracted is None  # capped


def test_math_robust_keeps_multiple_answers_instead_of_choosing() -> None:
    verdict = MATH.scorers()["robust"]("So $x = 2$ or $x = 3$.", math_problem("2"))
    assert not verdict.correct and verdict.extracted == "2, 3"


def test_math_robust_uses_the_box_exactly_as_strict() -> None:
    response = "\\boxed{4}\nWait, the answer is 5."
    robust = MATH.scorers()["robust"](response, math_problem("5"))
    assert robust == MATH.verify(response, math_problem("5"))
    assert not robust.correct and robust.extracted == "4"


@pytest.mark.parametrize("gold, response, correct", [
    ("1234", "So she earns $1,234.", True),
    ("18", "The answer is 18.00", True),
    ("18", "#### 18", True),
    ("-5", "The temperature drops to -5.", True),
    ("0.5", "It holds .5 liters.", True),
    ("1000000", "The answer is $1,000,000.", True),
    ("2", "5 - 3 = 2", True),
    ("18", "18.5", False),
    ("18", "180", False),
    ("18", "The answer is 18. I hope this helps with your 2 questions.", False),  # final number
    ("18", "I do not know.", False),
])
def test_final_number_scorer(gold: str, response: str, correct: bool) -> None:
    verdict = GSM8K.verify(response, Problem("g", "q", gold))
    assert verdict.correct is correct


def test_no_extraction_is_incorrect_with_none() -> None:
    verdict = GSM8K.verify("no number here", Problem("g", "q", "3"))
    assert (verdict.correct, verdict.extracted) == (False, None)
    assert GSM8K.reward("no number here", Problem("g", "q", "3")) == 0.0
    assert GSM8K.reward("The answer is 3.", Problem("g", "q", "3")) == 1.0


CHOICES = (("A", "bank"), ("B", "library"), ("C", "department store"), ("D", "mall"),
           ("E", "new york"))


@pytest.mark.parametrize("response, strict, final", [
    ("A bank keeps money safe.\nAnswer: A", True, True),
    ("Answer: (A) bank", True, True),
    ("Answer: A or D", False, False),  # ambiguous declaration
    ("Answer: D\nActually no.\nAnswer: A", False, True),  # conflicting: strict rejects
    ("I lean towards A, the bank.", False, False),  # no declaration of either kind
    ("The best answer is A.", False, True),
    ("The answer is A.", False, True),
    ("Answer: bank", False, True),
    ("Answer: E", False, False),
])
def test_csqa_scorers(response: str, strict: bool, final: bool) -> None:
    problem = Problem("c", "Where is money kept?", "A", choices=CHOICES)
    assert CSQA.verify(response, problem).correct is strict
    assert CSQA.scorers()["final"](response, problem).correct is final


def test_scorers_are_registered_by_name_and_roles_resolve() -> None:
    names = {"math_boxed", "math_robust", "final_number", "csqa_letter", "csqa_final"}
    assert names <= set(SCORERS)
    assert set(MATH.scorers()) == {"strict", "robust"}
    assert set(CSQA.scorers()) == {"strict", "final"}
    assert set(GSM8K.scorers()) == {"strict"}
    assert get_scorer("final_number")("42", Problem("g", "q", "42")).correct
