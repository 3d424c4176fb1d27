"""Markdown helpers and the Table VI-style privacy budget table."""

from __future__ import annotations

import pytest

from dpgrpo.errors import DataError
from dpgrpo.reports.tables import fmt_p, markdown_table, privacy_budget_table

TABLE_VI = [
    {"configuration": "MATH, ε=1 arm", "n": 6988, "m": 128, "sigma": 1.002, "T": 50,
     "pld_epsilon": 1.0, "rdp_epsilon": 1.4634, "rdp_order": 7.6},
    {"configuration": "MATH, reference", "n": 6988, "m": 128, "noise_multiplier": 0.484,
     "rounds": 50, "pld_epsilon": 8.0, "rdp_epsilon": 9.83, "rdp_order": 2.3},
    {"configuration": "GSM8K, CSQA", "n": 6961, "m": 128, "sigma": 0.52, "T": 100,
     "pld_epsilon": 7.99999, "rdp_epsilon": 9.701, "rdp_order": 2.3},
]


def test_privacy_budget_table_matches_table_vi() -> None:
    lines = privacy_budget_table(TABLE_VI).splitlines()
    assert lines[0] == "| Configuration | n | (m, σ, T) | PLD ε | RDP ε (order) |"  # noqa: RUF001
    assert lines[1] == "| --- | --- | --- | --- | --- |"
    assert lines[2] == "| MATH, ε=1 arm | 6,988 | (128, 1.002, 50) | 1.000 | 1.463 (7.6) |"
    assert lines[3] == "| MATH, reference | 6,988 | (128, 0.484, 50) | 8.000 | 9.830 (2.3) |"
    assert lines[4] == "| GSM8K, CSQA | 6,961 | (128, 0.520, 100) | 8.000 | 9.701 (2.3) |"
    assert len(lines) == 5
    old = {**{k: v for k, v in TABLE_VI[1].items() if k != "rounds"}, "steps": 50}  # 0.2.0's name
    assert privacy_budget_table([old]).splitlines()[2] == lines[3]


def test_privacy_budget_table_optional_columns() -> None:
    row = {**TABLE_VI[0], "delta": 1 / 69880}
    del row["rdp_order"]
    lines = privacy_budget_table([row]).splitlines()
    assert lines[0] == "| Configuration | n | δ | (m, σ, T) | PLD ε | RDP ε (order) |"  # noqa: RUF001
    assert lines[2] == "| MATH, ε=1 arm | 6,988 | 1.43e-05 | (128, 1.002, 50) | 1.000 | 1.463 |"


def test_privacy_budget_table_errors_name_row_and_field() -> None:
    bad = [TABLE_VI[0], {k: v for k, v in TABLE_VI[1].items() if k != "rounds"}]
    with pytest.raises(DataError, match="line 2, field 'T'"):
        privacy_budget_table(bad)
    with pytest.raises(DataError, match="line 1, field 'pld_epsilon': expected a number"):
        privacy_budget_table([{**TABLE_VI[0], "pld_epsilon": "8"}])


def test_markdown_helpers() -> None:
    assert markdown_table(["a", "b"], [["1", "x|y"]]) == "| a | b |\n| --- | --- |\n| 1 | x\\|y |"
    assert [fmt_p(p) for p in (1.0, 0.0132, 0.0011, 6.43e-5)] == ["1", "0.013", "0.0011", "6.4e-05"]
