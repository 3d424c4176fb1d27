"""Fallback extraction of the MATH format-robust scorer (DP-GRPO paper, Appendix E-A).

Used only for responses without a ``\\boxed{}`` answer that finished below the token cap. The
segment read is the final explicit answer statement ("the final answer is ..."), else the
final inferential statement ("therefore ...", "we get ..."), else the final nonempty line.
Within it the candidate is the last run of math spans (each reduced to the right-hand side of
an assignment), else a stated plain-text value; answers joined by "and"/"or" are kept
together as a comma list, never narrowed to one. The extractor never sees the gold answer.
"""

from __future__ import annotations

import re

_EXPLICIT = re.compile(
    r"(?:final\s+answer|the\s+answer|answer|the\s+(?:final\s+)?result|the\s+solution)"
    r"[\s*_]*(?:is|:|=|would\s+be|will\s+be)[\s*_:]*",
    re.IGNORECASE,
)
_INFERENTIAL = re.compile(
    r"(?:(?:^|(?<=[.!?:])\s+|\n)\s*(?:so|thus|therefore|hence|consequently)\b[\s,]*"
    r"|\b(?:we\s+(?:get|find|obtain|have|conclude\s+that)|which\s+gives|this\s+gives|gives\s+us"
    r"|is\s+equal\s+to|equals)\b[\s:]*"
    r"|\\therefore|∴)",
    re.IGNORECASE | re.MULTILINE,
)
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$(.+?)\$|\\\((.+?)\\\)", re.DOTALL)
_JOINER = re.compile(r"^[\s,;]*(?:(?:and|or)\b)?[\s,;]*$", re.IGNORECASE)
_PLAIN_VALUE = re.compile(
    r"[-+−]?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+(?:\.\d+)?)?"  # noqa: RUF001 - the report's typography
    r"(?:\s*(?:\\?pi|π|\\?sqrt\s*\{?\d+\}?|√\s*\d+))?"
)
_STATED = re.compile(r"(?:=|\bis\b|\bare\b|\bequals\b|\bbe\b|:)", re.IGNORECASE)
_SPLIT_ALTERNATIVES = re.compile(r"\s+(?:and|or)\s+|\s*;\s*", re.IGNORECASE)
_MAX_WORD_CHARS = 20


def _segment_after(pattern: re.Pattern[str], text: str) -> str | None:
    """Text after the last match of ``pattern``: the rest of its line, or the next nonempty
    line (a display block) when the marker ends its line."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():]
    line, _, after = rest.partition("\n")
    if line.strip(" .:*_") or not after.strip():
        return line.strip()
    if after.lstrip().startswith(("$$", "\\[")):  # a display block may span several lines
        span = _MATH_SPAN.match(after.lstrip())
        if span:
            return span.group(0)
    return after.strip().splitlines()[0].strip()


def _final_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _rhs(expr: str) -> str:
    """Right-hand side of the last ``=`` (or ``\\approx``) of an assignment, else ``expr``."""
    parts = re.split(r"(?<![<>!\\])=|\\approx", expr)
    return parts[-1].strip() if parts[-1].strip() else expr.strip()


def _alternatives(expr: str) -> list[str]:
    """Split ``x = 2 or x = 3`` (also ``\\text{ or }``) into right-hand sides."""
    expr = re.sub(r"\\(?:text|textrm|mbox)\{\s*(and|or)\s*\}", r" \1 ", expr)
    expr = re.sub(r"\\quad|\\qquad", " ", expr)
    return [_rhs(part) for part in _SPLIT_ALTERNATIVES.split(expr) if part.strip()]


def _from_math_spans(segment: str) -> str | None:
    spans = list(_MATH_SPAN.finditer(segment))
    if not spans:
        return None
    run = [spans[-1]]
    for prev in reversed(spans[:-1]):  # extend over spans joined only by ",", "and", "or"
        if not _JOINER.match(segment[prev.end():run[0].start()]):
            break
        run.insert(0, prev)
    values = [v for span in run for v in _alternatives(next(g for g in span.groups() if g))]
    values = [v.rstrip(" .,;") for v in values if v.rstrip(" .,;")]
    return ", ".join(values) if values else None


def _from_plain_text(segment: str) -> str | None:
    stated = list(_STATED.finditer(segment))
    tail = segment[stated[-1].end():] if stated else segment
    tail = tail.strip().rstrip(".!")
    values = []
    for part in _SPLIT_ALTERNATIVES.split(tail):
        part = part.strip().strip("*_").strip()
        match = _PLAIN_VALUE.match(part)
        if match:
            values.append(match.group(0).replace("−", "-").strip())  # noqa: RUF001 - the report's typography
        elif re.fullmatch(r"\([A-Z]\)", part) or (
            re.fullmatch(r"[A-Za-z]+", part) and len(part) <= _MAX_WORD_CHARS
        ):  # a multiple-choice label such as (C)
            values.append(f"\\text{{{part}}}")
    return ", ".join(values) if values else None


def candidate_from_segment(segment: str) -> str | None:
    """The answer a statement gives: math spans first, then a stated plain value."""
    return _from_math_spans(segment) or _from_plain_text(segment)


def fallback_answer(response: str) -> str | None:
    """The format-robust candidate of an unboxed, uncapped response (None: nothing found)."""
    for find in (lambda t: _segment_after(_EXPLICIT, t),
                 lambda t: _segment_after(_INFERENTIAL, t),
                 _final_line):
        segment = find(response)
        if segment:
            candidate = candidate_from_segment(segment)
            if candidate:
                return candidate
    return None
