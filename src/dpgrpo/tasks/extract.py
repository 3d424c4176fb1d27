"""Pure text extractors shared by the verifiers: boxed answers and final numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BOX = re.compile(r"\\(?:boxed|fbox)\b\s*")
_TOKEN = re.compile(r"[^\s$\\]+")
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)

#: Boxes opened inside this many open boxes are not answers (their braces still count).
#: Every character is copied into at most this many answers, so extraction stays linear.
MAX_BOX_DEPTH = 8


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` (or ``\\fbox``) in order; nested braces kept.

    ``\\boxed 5`` (no braces) yields the next token. An unterminated box (a response cut at
    the cap) yields nothing. One pass with a stack of open groups (``\\{`` and ``\\}`` are
    escaped); boxes nested deeper than :data:`MAX_BOX_DEPTH` are skipped, so the time and
    memory are linear in the length of ``text`` whatever it holds.
    """
    opens: dict[int, int] = {}  # position of a box's "{" -> position of its "\boxed"
    tokens: list[tuple[int, str]] = []
    for match in _BOX.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            opens[start] = match.start()
        else:
            token = _TOKEN.match(text, start)
            if token:
                tokens.append((match.start(), token.group(0)))
    if not opens:
        return [token for _, token in tokens]
    found: list[tuple[int, str]] = list(tokens)
    stack: list[int | None] = []  # per open group: the position of its box's "{", or None
    boxes_open = 0
    for match in _BRACE_OR_ESCAPE.finditer(text):
        char, pos = match.group(0), match.start()
        if char == "{":
            is_box = pos in opens and boxes_open < MAX_BOX_DEPTH
            stack.append(pos if is_box else None)
            boxes_open += is_box
        elif char == "}" and stack:
            brace = stack.pop()
            if brace is not None:
                boxes_open -= 1
                found.append((opens[brace], text[brace + 1:pos].strip()))
    return [content for _, content in sorted(found, key=lambda item: item[0])]


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{}`` in ``text`` (None if there is none)."""
    boxes = boxed_answers(text)
    return boxes[-1] if boxes else None


# A number: optional sign (not a hyphen between words/digits), optional currency, digits with
# optional thousands separators, optional decimals; or a bare decimal such as ".5".
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212]\s?)?\\?\$?\s?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?![\d])"
)


def canonical_number(text: str) -> str | None:
    """Canonical decimal string of a plain number (``"$1,234.50."`` -> ``"1234.5"``)."""
    cleaned = text.strip().replace("\u2212", "-").replace("\\$", "").replace("$", "")
    cleaned = cleaned.replace(",", "").rstrip(".").strip()
    if cleaned.startswith("+"):
        cleaned = cleaned[1:]
    if not re.fullmatch(r"-?\s?(\d+(\.\d*)?|\.\d+)", cleaned):
        return None
    try:
        value = Decimal(cleaned.replace(" ", ""))
    except InvalidOperation:
        return None
    return _format_decimal(value)


def _format_decimal(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def numbers_in(text: str) -> list[str]:
    """Every number in ``text``, canonicalized, in order (commas, currency, signs handled)."""
    out = []
    for match in _NUMBER.finditer(text):
        sign = "-" if match.group("sign") else ""
        value = canonical_number(sign + match.group("num"))
        if value is not None:
            out.append(value)
    return out


def final_number(text: str) -> str | None:
    """The last number in ``text``, canonicalized (the GSM8K/SVAMP extraction rule)."""
    found = numbers_in(text)
    return found[-1] if found else None


def same_number(a: str, b: str) -> bool:
    """Exact numeric equality of two canonical numbers (``"18"`` == ``"18.0"``)."""
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False
