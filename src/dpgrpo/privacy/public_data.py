"""Data declared public must not hold the private training questions: a check by content.

A public warm start and a tuning proxy are used outside the mechanism, so no certificate covers
them. Comparing task names and splits is not enough: two tasks with different names can share
questions (``arithmetic-proxy`` drawn from the same templates as ``arithmetic`` once shared
189 of its 1,000 training questions with it). The rule here compares content:

* every question is **normalised**: Unicode NFKC, casefolded, runs of whitespace collapsed to
  one space, punctuation (Unicode category P*) stripped at both ends;
* a public question **overlaps** the private set when its normalised text equals a private
  question's (compared by SHA-256), or when it shares a sequence of :data:`NGRAM` = 13 words
  with one (the 13-gram rule of the GPT-3 contamination study, Brown et al. 2020, Appendix C;
  words are the normalised text split on whitespace, each stripped of punctuation at its
  ends). A question of fewer than 13 words can only overlap by equality.

The check reads the private training questions to compare them and stops before anything is
trained; nothing computed from them is written. Its pass or fail does depend on the private
data (a proxy that passed shares no question with it): it is a guard on the inputs, not a
mechanism with a certificate.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dpgrpo.errors import PublicDataError

#: words in a shared sequence that count as an overlap (Brown et al. 2020, Appendix C)
NGRAM = 13
#: characters of each overlapping question shown in an error
EXAMPLE_CHARS = 60


def _strip_punctuation(text: str) -> str:
    start, end = 0, len(text)
    while start < end and unicodedata.category(text[start]).startswith("P"):
        start += 1
    while end > start and unicodedata.category(text[end - 1]).startswith("P"):
        end -= 1
    return text[start:end]


def normalise(text: str) -> str:
    """NFKC, casefold, whitespace collapsed to single spaces, punctuation stripped at the ends."""
    return _strip_punctuation(" ".join(unicodedata.normalize("NFKC", text).casefold().split()))


def question_key(text: str) -> str:
    """SHA-256 (hex) of the normalised question: equal for case and whitespace variants."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()


def words(text: str) -> list[str]:
    """The normalised question's words, each stripped of punctuation at its ends."""
    return [w for w in (_strip_punctuation(w) for w in normalise(text).split(" ")) if w]


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every sequence of ``n`` consecutive words (none when the question is shorter)."""
    ws = words(text)
    return {tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)}


@dataclass(frozen=True)
class Overlap:
    """Which public questions overlap the private set, and how."""

    count: int                  # public questions that overlap (by equality or an n-gram)
    exact: int                  # ... of which equal a private question once normalised
    total: int                  # public questions compared
    examples: tuple[str, ...]   # the first overlapping public questions, truncated


def _truncate(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXAMPLE_CHARS else flat[:EXAMPLE_CHARS - 3] + "..."


def question_overlap(public: Iterable[str], private: Iterable[str], *, n: int = NGRAM,
                     max_examples: int = 2) -> Overlap:
    """How many ``public`` questions equal a ``private`` one once normalised, or share ``n``
    consecutive normalised words with one (module docstring: the public rule)."""
    private_keys: set[str] = set()
    private_grams: set[tuple[str, ...]] = set()
    for question in private:
        private_keys.add(question_key(question))
        private_grams |= ngrams(question, n)
    count = exact = total = 0
    examples: list[str] = []
    for question in public:
        total += 1
        equal = question_key(question) in private_keys
        if equal or not ngrams(question, n).isdisjoint(private_grams):
            count, exact = count + 1, exact + equal
            if len(examples) < max_examples:
                examples.append(_truncate(question))
    return Overlap(count, exact, total, tuple(examples))


#: why an overlap with the private training set is refused
PRIVATE_REASON = ("data used outside the mechanism is not covered by any certificate, so it "
                  "must be public; give a set without them (docs/tuning.md, 'What is public')")


def check_disjoint(public: Sequence[str], private: Sequence[str], *, what: str, against: str,
                   error: type[Exception] = PublicDataError,
                   reason: str = PRIVATE_REASON) -> Overlap:
    """Raise ``error`` when any of ``public`` (named ``what``) overlaps ``private`` (named
    ``against``): the message gives the count, two examples and ``reason``. Returns the
    (empty) overlap."""
    found = question_overlap(public, private)
    if found.count:
        shown = "; ".join(repr(e) for e in found.examples)
        raise error(
            f"{what}: {found.count} of its {found.total} questions are in {against}; "
            f"{found.exact} equal one once normalised, {found.count - found.exact} share "
            f"{NGRAM} words in a row with one (e.g. {shown}): {reason}")
    return found


__all__ = ["NGRAM", "Overlap", "check_disjoint", "ngrams", "normalise", "question_key",
           "question_overlap", "words"]
