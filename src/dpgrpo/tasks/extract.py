"""Pure text extractors shared by the verifiers: boxed answers and final numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BOX = re.compile(r"\\(?:boxed|fbox)\b\s*")


def _group_end(text: str, start: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``start`` (``\\{`` and ``\\}`` escaped)."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` (or ``\\fbox``) in order; nested braces kept.

    ``\\boxed 5`` (no braces) yields the next token. An unterminated box (a response cut at
    the cap) yields nothing.
    """
    found: list[str] = []
    for match in _BOX.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            end = _group_end(text, start)
            if end is not None:
                found.append(text[start + 1:end - 1].strip())
        else:
            token = re.match(r"[^\s$\\]+", text[start:])
            if token:
                found.append(token.group(0))
    return found


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
