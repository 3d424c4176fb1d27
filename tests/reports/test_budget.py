"""Table VI budget rows of training configs: n from the slots, delta = 1/(10 n), paper values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.reports.budget import budget_rows, count_slots, resolve_budget, write_budget_report

MATH_SIGMA = 0.4842404738068581  # Table VII, MATH reference


def _write(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_slots_follow_limit_canaries_and_n_slots():
    base = embedded_default()
    assert count_slots(apply_overrides(base, ["data.limit=40"])) == 40
    assert count_slots(apply_overrides(base, ["data.limit=40", "audit.canaries=5"])) == 45
    assert count_slots(apply_overrides(base, ["data.limit=40", "data.n_slots=100"])) == 100
    assert count_slots(base) == 1000  # the whole arithmetic train split
    with pytest.raises(ConfigError, match="n_slots = 44 is smaller than the 45 records"):
        count_slots(apply_overrides(base, ["data.limit=40", "audit.canaries=5",
                                           "data.n_slots=44"]))


def test_row_uses_default_delta_and_the_given_sigma():
    cfg = apply_overrides(embedded_default(), ["data.limit=40", "audit.canaries=5",
                                               "privacy.expected_batch=4",
                                               "privacy.noise_multiplier=1.0", "train.rounds=2"])
    row = resolve_budget(cfg, "tiny")
    expected = compute_epsilon(45, 4, 2, 1.0, 1 / 450)
    assert (row.n, row.m, row.sigma, row.T) == (45, 4.0, 1.0, 2)
    assert row.delta == pytest.approx(1 / 450) and row.q == pytest.approx(4 / 45)
    assert row.pld_epsilon == expected.epsilon and row.rdp_epsilon == expected.rdp_epsilon
    assert not row.sigma_calibrated and row.target_epsilon is None
    explicit = resolve_budget(apply_overrides(cfg, ["privacy.delta=1e-3"]), "tiny")
    assert explicit.delta == 1e-3 and explicit.pld_epsilon > row.pld_epsilon
    with pytest.raises(ConfigError, match="non-private"):
        resolve_budget(apply_overrides(cfg, ["train.arm=non-private",
                                             "privacy.noise_multiplier=none"]))
    with pytest.raises(ConfigError, match="exceeds n = 45"):
        resolve_budget(apply_overrides(cfg, ["privacy.expected_batch=50"]))


def test_files_reproduce_table_vi_math_reference(tmp_path):
    """MATH reference of Table VI: (6,988; 128, 0.484, 50) -> PLD 8.000, RDP 9.83 (2.3)."""
    cfg = _write(tmp_path / "math-ref.toml", f"""
[data]
task = "arithmetic"
n_slots = 6988
[privacy]
expected_batch = 128
noise_multiplier = {MATH_SIGMA!r}
[train]
rounds = 50
[protocol]
seeds = 2
""")
    tiny = _write(tmp_path / "tiny.toml", """
[data]
limit = 40
[privacy]
expected_batch = 4
noise_multiplier = 1.0
[train]
rounds = 2
""")
    rows = budget_rows([cfg, tiny])
    math_row, tiny_row = rows
    assert math_row.configuration == "math-ref" and math_row.n == 6988
    assert math_row.delta == pytest.approx(1 / 69880)
    assert round(math_row.pld_epsilon, 3) == 8.0 and math_row.rdp_order == 2.3
    assert math_row.rdp_epsilon == pytest.approx(9.83, abs=0.01)
    assert tiny_row.n == 40
    written = write_budget_report(rows, tmp_path / "out" / "budget.md", as_json=True)
    assert [p.name for p in written] == ["budget.md", "budget.json"]
    md = written[0].read_text()
    assert "| math-ref | 6,988 | 1.43e-05 | (128, 0.484, 50) | 8.000 | 9.833 (2.3) |" in md
    assert json.loads(written[1].read_text())[0]["sigma"] == MATH_SIGMA
    with pytest.raises(ConfigError, match="beside it"):
        write_budget_report(rows, tmp_path / "budget.json", as_json=True)
    with pytest.raises(ConfigError, match=r"unknown key 'train.nope'"):
        budget_rows([tiny], ["train.nope=1"])
    with pytest.raises(ConfigError, match="config file not found"):
        budget_rows([tmp_path / "missing.toml"])
