"""Option-letter extraction for CommonsenseQA (strict declaration and final-answer rescore).

Strict (the training reward, Sec. VII-A): every ``Answer: <letter>`` declaration in the
response is read; one letter overall is extracted, and declarations naming different letters
reject the response. Final-answer rescore (Appendix E-B): only the last explicit declaration
counts (``Answer: B``, ``the answer is B``, ``the correct option is (B)``, ...); a declaration
naming several letters abstains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The letter of a declaration: optional markdown/brackets, an uppercase letter that is not the
# start of a word ("Answer: Bank" names no letter), optional closing bracket.
_LETTER = r"[\s*_]*[\(\[]?\s*(?P<letter>[A-E])(?![A-Za-z0-9'])\s*[\)\]]?[\s*_]*"
_MORE = re.compile(r"\s*(?:,|/|\||&|\bor\b|\band\b)\s*[\(\[]?\s*([A-E])(?![A-Za-z0-9'])")

_STRICT = re.compile(r"(?<![A-Za-z])answer[\s*_]*:", re.IGNORECASE)
_FINAL = re.compile(
    r"(?<![A-Za-z])(?:answer[\s*_]*:"
    r"|answer\s+(?:is|would\s+be|will\s+be|should\s+be)\s*:?"
    r"|(?:correct|best|right)\s+(?:answer|option|choice)\s+(?:is|would\s+be)\s*:?"
    r"|(?:i\s+(?:choose|pick|select))\s*:?"
    r"|(?:option|choice)\s+(?=[\(\[]?[A-E][\)\]]?\s*(?:is\s+(?:the\s+)?correct)))",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Declaration:
    """One answer declaration: where it starts and the letters it names (in order)."""

    start: int
    letters: tuple[str, ...]
    text: str  # the rest of the declaration's line

    @property
    def letter(self) -> str | None:
        """The one letter named, or None if none or several distinct ones."""
        distinct = set(self.letters)
        return self.letters[0] if len(distinct) == 1 else None


def _read(text: str, start: int, end: int) -> Declaration:
    line_end = text.find("\n", end)
    rest = text[end:] if line_end < 0 else text[end:line_end]
    match = re.match(_LETTER, rest)
    if not match:
        return Declaration(start, (), rest.strip())
    letters = [match.group("letter")]
    pos = match.end("letter")
    while (more := _MORE.match(rest, pos)) is not None:
        letters.append(more.group(1))
        pos = more.end()
    return Declaration(start, tuple(letters), rest.strip())


def strict_declarations(text: str) -> list[Declaration]:
    """Every ``Answer:`` declaration (case-insensitive ``answer``, uppercase letter)."""
    return [_read(text, m.start(), m.end()) for m in _STRICT.finditer(text.replace("\u00a0", " "))]


def final_declarations(text: str) -> list[Declaration]:
    """Every explicit answer declaration, in the broader final-answer sense."""
    return [_read(text, m.start(), m.end()) for m in _FINAL.finditer(text.replace("\u00a0", " "))]


def strict_letter(text: str) -> str | None:
    """The one letter all ``Answer:`` declarations agree on (None: none, or conflicting)."""
    letters = {letter for d in strict_declarations(text) for letter in d.letters}
    return letters.pop() if len(letters) == 1 else None


def final_letter(text: str, choices: tuple[tuple[str, str], ...] | None = None) -> str | None:
    """The letter of the last explicit declaration; None if it names none or several.

    If the last declaration names no letter but is exactly one option's text (``Answer:
    library``), that option's label is returned.
    """
    declarations = final_declarations(text)
    if not declarations:
        return None
    last = declarations[-1]
    if last.letters:
        return last.letter
    if choices:
        said = last.text.strip(" .*_\"'").lower()
        matches = [label for label, option in choices if option.strip().lower() == said]
        if len(matches) == 1:
            return matches[0]
    return None
