"""Symbolic answer equality with math-verify, behind a guard and a wall-clock bound.

:func:`symbolic_equal` parses a reference and a candidate answer (LaTeX, the content of a
``\\boxed{}``) with math-verify, refuses pathological expressions (overlong or deeply nested
text, which stalls the parser; a power tower or factorial whose value would have more than
:data:`MAX_DIGITS` digits, which no signal could interrupt),
and compares them with ``math_verify.verify`` — fractions, ``\\dfrac``, radicals, intervals,
sets, units and ``\\text`` wrappers are math-verify's normalizations, not ours. The whole
check runs under :func:`dpgrpo.tasks.bounded.run_bounded`; a timeout or a guard trip counts
as incorrect and is reported.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import cast

from dpgrpo.tasks.base import DEFAULT_CHECK_TIMEOUT_S
from dpgrpo.tasks.bounded import Mode, run_bounded

#: A numeric sub-expression whose value would need more decimal digits than this is refused.
MAX_DIGITS = 100_000
#: A symbolic power with a larger exponent is refused (expansion would never finish).
MAX_SYMBOLIC_EXPONENT = 100_000
#: Answers longer than this (characters) are refused before parsing.
MAX_ANSWER_CHARS = 2_000
#: Answers nested deeper than this (braces and brackets) are refused before parsing
#: (MATH reference answers nest at most 3 deep; the parser slows sharply with depth).
MAX_NESTING = 20


@dataclass(frozen=True)
class Equality:
    """Outcome of one symbolic check."""

    equal: bool
    timed_out: bool = False  # the bound ran out, or the guard refused the input
    reason: str | None = None  # why the check did not complete


class _DisabledTimeoutNote(logging.Filter):
    """Drop math-verify's one-time note that its own (signal) timeout is off: ours is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_DisabledTimeoutNote())


class _TooBig(Exception):
    pass


def _log10_bound(expr: object) -> float | None:
    """Upper bound on log10 |value| of a numeric sympy tree (None if it has symbols).

    Walks the unevaluated tree and raises :class:`_TooBig` where evaluation would explode.
    """
    import sympy

    if isinstance(expr, sympy.Integer):
        return math.log10(abs(int(expr))) if expr != 0 else -math.inf
    if isinstance(expr, sympy.Rational):
        return math.log10(abs(int(expr.p))) - math.log10(int(expr.q)) if expr != 0 else -math.inf
    if isinstance(expr, sympy.Float):
        return math.log10(abs(float(expr))) if expr != 0 else -math.inf
    if isinstance(expr, sympy.NumberSymbol) or expr in (sympy.I, sympy.E):
        return 0.5
    if not isinstance(expr, sympy.Basic):
        return None
    children = [_log10_bound(arg) for arg in expr.args]
    if isinstance(expr, sympy.Pow):
        return _pow_bound(*children)
    if isinstance(expr, sympy.factorial):
        return _factorial_bound(children[0])
    if any(c is None for c in children) or not children:
        return None
    bounds = cast(list[float], children)                       # none of them is None
    if isinstance(expr, sympy.Add):
        return max(bounds) + math.log10(len(bounds))
    if isinstance(expr, sympy.Mul):
        return sum(bounds)
    return None


def _value_bound(log10_value: float) -> float:
    return math.inf if log10_value > 300 else 10.0 ** log10_value


def _pow_bound(base: float | None, exponent: float | None) -> float | None:
    if exponent is None:
        return None
    exp_value = _value_bound(exponent)
    if base is None:
        if exp_value > MAX_SYMBOLIC_EXPONENT:
            raise _TooBig(f"symbolic power with an exponent near 10^{exponent:.0f}")
        return None
    digits = exp_value * abs(base) if base != -math.inf else 0.0
    if digits > MAX_DIGITS:
        raise _TooBig("a power whose value has more than "
                      f"{MAX_DIGITS} digits (exponent near 10^{exponent:.3g})")
    return digits if base > 0 else -digits


def _factorial_bound(arg: float | None) -> float | None:
    if arg is None:
        return None
    n = _value_bound(arg)
    digits = math.inf if n > 1e12 else math.lgamma(n + 1) / math.log(10)
    if digits > MAX_DIGITS:
        raise _TooBig(f"a factorial with more than {MAX_DIGITS} digits")
    return digits


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``{}``, ``()`` and ``[]`` in ``text`` (escaped braces count too)."""
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(depth - 1, 0)
    return deepest


def text_pathology(text: str) -> str | None:
    """Why an answer's text must not even be parsed, or None."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"answer longer than {MAX_ANSWER_CHARS} characters"
    if nesting_depth(text) > MAX_NESTING:
        return f"answer nested deeper than {MAX_NESTING} levels"
    return None


def pathology(parsed: list[object]) -> str | None:
    """Why a parsed answer must not be evaluated, or None if it is safe."""
    for item in parsed:
        if isinstance(item, str):
            continue
        try:
            _log10_bound(item)
        except _TooBig as err:
            return str(err)
        except (RecursionError, OverflowError, ValueError):
            return "an expression the guard cannot bound"
    return None


def parse_answer(latex: str) -> list[object]:
    """Parse an answer's LaTeX (boxed content) with math-verify; [] if unparsable."""
    from math_verify import parse
    from math_verify.parser import LatexExtractionConfig

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    return parse("\\boxed{" + latex + "}", extraction_config=config, parsing_timeout=None)


def _compare(gold: str, candidate: str) -> tuple[bool, str | None]:
    """Parse, guard and compare; runs inside the bound (module-level so a worker can run it)."""
    from math_verify import verify

    gold_parsed, cand_parsed = parse_answer(gold), parse_answer(candidate)
    if not gold_parsed or not cand_parsed:
        return False, None
    for parsed in (gold_parsed, cand_parsed):
        reason = pathology(parsed)
        if reason is not None:
            return False, reason
    return bool(verify(gold_parsed, cand_parsed, timeout_seconds=None)), None


def symbolic_equal(gold: str, candidate: str, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
                   mode: Mode = "auto") -> Equality:
    """Is ``candidate`` symbolically equal to the reference ``gold``? (MATH strict check.)

    Bounded by ``timeout_s`` seconds of wall clock; a timeout or a guard trip is reported in
    :attr:`Equality.timed_out` and counts as not equal.
    """
    if not gold.strip() or not candidate.strip():
        return Equality(False)
    reason = text_pathology(candidate) or text_pathology(gold)
    if reason is not None:
        return Equality(False, True, reason)
    result, timed_out = run_bounded(_compare, (gold, candidate), timeout_s, mode=mode)
    if timed_out:
        return Equality(False, True, f"check exceeded {timeout_s:g} s")
    equal, reason = result if result is not None else (False, None)
    return Equality(equal, reason is not None, reason)
