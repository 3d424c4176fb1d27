"""Public data is compared with the private training set by content (issue 56): normalised
text and shared 13-word sequences, not task names."""

from __future__ import annotations

import pytest

from dpgrpo.errors import PrivacyError, PublicDataError
from dpgrpo.privacy.public_data import (
    NGRAM,
    check_disjoint,
    ngrams,
    normalise,
    question_key,
    question_overlap,
    words,
)

PRIVATE = [
    "Tom has 3 apples. He buys 4 more apples. How many apples does Tom have now?",
    "A train leaves the station at 9 am and travels at 60 miles per hour towards a city "
    "that is 240 miles away. When does it arrive?",
    "What is 7 + 5?",
]


def test_normalise_folds_case_width_whitespace_and_end_punctuation():
    assert normalise("  TOM has 3\tapples.\n  He buys 4!  ") == "tom has 3 apples. he buys 4"
    assert normalise("ＴＯＭ ｈａｓ ３") == "tom has 3"  # noqa: RUF001 - NFKC: full-width forms
    assert normalise("\u00bfStraße?") == "strasse"                   # casefold; both ends
    assert question_key(" tom HAS 3 apples. he buys 4 more apples. how many apples does tom "
                        "have now ") == question_key(PRIVATE[0])
    assert question_key("Tom has 4 apples.") != question_key("Tom has 3 apples.")
    assert words("Tom has 3 apples. He (buys) 4!") == ["tom", "has", "3", "apples", "he", "buys",
                                                        "4"]


def test_ngrams_of_a_short_question_are_none():
    assert NGRAM == 13
    assert ngrams(PRIVATE[2]) == set()                               # 4 words
    assert len(ngrams(PRIVATE[0])) == 16 - 13 + 1                    # 16 words: 4 windows


def test_overlap_counts_variants_and_shared_13_grams_and_nothing_else():
    public = [
        "tom   HAS 3 apples.  he buys 4 more apples. How many apples does Tom have now",  # case
        # 13 words in a row of a private question ("a train ... 60 miles") in another text
        "Yesterday a train leaves the station at 9 am and travels at 60 miles in a day.",
        # the same 12 words only ("a train ... at 60"), one short of 13: does not count
        "Yesterday a train leaves the station at 9 am and travels at 60 km per day.",
        "Sara has 3 apples. She buys 4 more apples. How many apples does Sara have now?",
        "what is 7 + 5",                                                # short, equal: counts
        "What is 7 + 6?",                                               # short, unequal
    ]
    found = question_overlap(public, PRIVATE)
    assert (found.count, found.exact, found.total) == (3, 2, 6)
    assert found.examples[0].startswith("tom HAS 3 apples. he buys")
    assert found.examples[1].endswith("...") and len(found.examples[1]) == 60
    assert question_overlap(public[3:4], PRIVATE).count == 0    # other name: every window differs
    assert question_overlap([], PRIVATE).count == 0


def test_check_disjoint_names_the_count_and_two_examples():
    public = [q.upper() for q in PRIVATE] + ["How many legs do 3 spiders have?"]
    with pytest.raises(PublicDataError, match=r"the proxy: 3 of its 4 questions are in the "
                                              r"private set; 3 equal one once normalised") as err:
        check_disjoint(public, PRIVATE, what="the proxy", against="the private set")
    assert isinstance(err.value, PrivacyError)
    assert "'TOM HAS 3 APPLES" in str(err.value) and "WHAT IS 7" not in str(err.value)
    assert check_disjoint(public[3:], PRIVATE, what="p", against="q").count == 0
    with pytest.raises(ValueError, match="1 of its 1 questions"):
        check_disjoint(public[:1], PRIVATE, what="p", against="q", error=ValueError)
