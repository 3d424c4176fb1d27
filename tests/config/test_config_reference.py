"""docs/config.md is generated from the schema of every table a user writes and must be
current (issues 28, 59)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dpgrpo.config.reference import SECTIONS, fields, render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_the_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/config.md is stale: python -m dpgrpo.config.reference > docs/config.md")


def test_every_key_of_every_table_is_on_the_page_with_its_type_and_what_it_does():
    assert list(SECTIONS) == ["model", "data", "privacy", "train", "audit", "protocol", "study",
                              "tune"]
    found = fields()
    page = PAGE.read_text(encoding="utf-8")
    for section, cls in SECTIONS.items():
        rows = {key: (kind, what) for key, kind, _, what in found[section]}
        assert list(rows) == [f.name for f in dataclasses.fields(cls)], section
        for key, (kind, what) in rows.items():
            assert what, f"{section}.{key} has no comment in its schema"
            assert kind, f"{section}.{key}"
            assert f"| `{section}.{key}` |" in page
    choices = {key: kind for key, kind, _, _ in found["train"]}
    assert choices["loss_type"] == '"grpo" \\| "dr_grpo" \\| "prompt_token_mean"'
    assert {key: kind for key, kind, _, _ in found["study"]}["sweep"] == "list of numbers"
    assert {key: d for key, _, d, _ in found["protocol"]}["arms"] == (
        '["dp-grpo", "zero-advantage", "filtered-sft", "gold-sft"]')


@dataclass(frozen=True)
class _Made:
    named: Literal["a", "b"] = "a"  # what it does
    undocumented: int = 1


def test_a_stale_page_or_an_undocumented_key_is_caught():
    rows = fields({"made": _Made})["made"]
    assert rows == [("named", '"a" \\| "b"', '"a"', "what it does"),
                    ("undocumented", "integer", "1", "")]
    assert "| `made.undocumented` | integer | `1` | - |" in render({"made": _Made})
