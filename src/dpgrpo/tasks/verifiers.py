"""The registered scorers: pure functions ``(response, problem) -> Verdict``.

Strict scorers are the training rewards (Sec. VII-A/VII-D of the DP-GRPO paper); ``math_robust``
and ``csqa_final`` are the sensitivity scorers of Appendix E. A response with no extraction
is incorrect (``extracted=None``) and stays in the denominator.
"""

from __future__ import annotations

from dpgrpo.tasks.base import DEFAULT_CHECK_TIMEOUT_S, Problem, Verdict, register_scorer
from dpgrpo.tasks.extract import final_number, last_boxed, same_number
from dpgrpo.tasks.letters import final_letter, strict_letter
from dpgrpo.tasks.robust import fallback_answer
from dpgrpo.tasks.symbolic import symbolic_equal


def _symbolic_verdict(candidate: str | None, problem: Problem, timeout_s: float) -> Verdict:
    if candidate is None:
        return Verdict(False, None)
    check = symbolic_equal(problem.answer, candidate, timeout_s=timeout_s)
    return Verdict(check.equal, candidate, check.timed_out)


@register_scorer("math_boxed")
def math_boxed(response: str, problem: Problem, *, hit_cap: bool = False,
               timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """MATH strict: the last ``\\boxed{}`` answer, symbolically equal to the reference."""
    return _symbolic_verdict(last_boxed(response), problem, timeout_s)


@register_scorer("math_robust")
def math_robust(response: str, problem: Problem, *, hit_cap: bool = False,
                timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """MATH format-robust (Appendix E-A): boxed answers exactly as strict; an unboxed response
    below the cap falls back to its final answer statement; a capped one is not eligible."""
    boxed = last_boxed(response)
    if boxed is not None:
        return _symbolic_verdict(boxed, problem, timeout_s)
    if hit_cap:
        return Verdict(False, None)
    return _symbolic_verdict(fallback_answer(response), problem, timeout_s)


@register_scorer("final_number")
def final_number_scorer(response: str, problem: Problem, *, hit_cap: bool = False,
                        timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """GSM8K/SVAMP strict: the last number in the response (commas, currency, trailing
    period handled) equals the reference number exactly."""
    value = final_number(response)
    if value is None:
        return Verdict(False, None)
    return Verdict(same_number(value, problem.answer), value)


@register_scorer("csqa_letter")
def csqa_letter(response: str, problem: Problem, *, hit_cap: bool = False,
                timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """CommonsenseQA strict: the one letter of the ``Answer:`` declarations; declarations
    naming different letters reject the response."""
    letter = strict_letter(response)
    return Verdict(letter is not None and letter == problem.answer, letter)


@register_scorer("csqa_final")
def csqa_final(response: str, problem: Problem, *, hit_cap: bool = False,
               timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> Verdict:
    """CommonsenseQA final-answer rescore (Appendix E-B): the last explicit declaration;
    an ambiguous one abstains."""
    letter = final_letter(response, problem.choices)
    return Verdict(letter is not None and letter == problem.answer, letter)
