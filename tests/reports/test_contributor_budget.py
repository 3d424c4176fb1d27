"""`dpgrpo privacy report` for contributor-level configs: n counts contributor slots, and the
table sets epsilon per contributor beside prompt-level DP's group figure for k problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpgrpo.cli import app
from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError
from dpgrpo.privacy.accounting import RoundEvent, compute_epsilon, group_epsilon
from dpgrpo.reports.budget import count_slots, resolve_budget


def _mapping(tmp_path: Path, per_person: int) -> Path:
    from dpgrpo.tasks import load_problems

    problems = load_problems("arithmetic", "train")
    path = tmp_path / "contributors.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "contributor": f"c{i // per_person}"}) + "\n"
                            for i, p in enumerate(problems)))
    return path


def _config(mapping: Path, *extra: str):
    return apply_overrides(embedded_default(), [
        "data.privacy_unit=contributor", f"data.contributors={mapping}",
        "data.per_contributor=2", "privacy.expected_batch=8", "privacy.noise_multiplier=1.0",
        "train.rounds=3", *extra])


def test_contributor_slots_and_the_comparison(tmp_path):
    # 1,000 problems, 500 contributors; n is public (data.n_slots), never the mapping's count
    cfg = _config(_mapping(tmp_path, per_person=2), "data.n_slots=500")
    assert count_slots(cfg) == 500
    with pytest.raises(ConfigError, match=r"data.limit = 40 with data.privacy_unit"):
        apply_overrides(cfg, ["data.limit=40"])  # a cut would couple contributors (issue 32)
    assert count_slots(apply_overrides(cfg, ["data.n_slots=600"])) == 600
    row = resolve_budget(cfg, "people")
    c = row.contributor
    assert row.unit == "contributor" and (row.n, row.q, row.delta) == (500, 8 / 500, 1 / 5000)
    assert row.pld_epsilon == compute_epsilon(500, 8, 3, 1.0, 1 / 5000).epsilon
    assert c.k == 2 and c.delta == row.delta and c.contributor_epsilon == row.pld_epsilon
    assert (c.prompt_n, c.prompt_sigma) == (1000, 1.0)   # the same data, one slot per problem
    assert c.prompt_epsilon == compute_epsilon(1000, 8, 3, 1.0, 1 / 5000).epsilon
    expected = group_epsilon([RoundEvent(8 / 1000, 1.0, 3)], 1 / 5000, 2)
    assert c.group_epsilon == expected and c.group_method == "pld-accountant"
    assert c.prompt_epsilon < c.contributor_epsilon < c.group_epsilon  # why contributor-level
    prompt_row = resolve_budget(embedded_default(), "plain")
    assert prompt_row.unit == "prompt" and prompt_row.contributor is None


def test_privacy_report_prints_the_contributor_comparison(tmp_path):
    mapping = _mapping(tmp_path, per_person=4)
    cfg = tmp_path / "people.toml"
    cfg.write_text(f'[data]\nprivacy_unit = "contributor"\ncontributors = "{mapping}"\n'
                   "per_contributor = 2\nn_slots = 250\n"
                   "[privacy]\nnoise_multiplier = 0.9\nexpected_batch = 8\n"
                   "[train]\nrounds = 3\n")
    out = tmp_path / "budget.md"
    result = CliRunner().invoke(app, ["privacy", "report", str(cfg), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout.strip().splitlines()[0])["rows"]  # one JSON object
    assert row["n"] == 250 and row["unit"] == "contributor" and not row["sigma_calibrated"]
    assert row["pld_epsilon"] == compute_epsilon(250, 8, 3, 0.9, 1 / 2500).epsilon
    c = row["contributor"]
    assert c["prompt_n"] == 1000 and c["k"] == 2 and c["prompt_sigma"] == 0.9
    assert c["group_epsilon"] == group_epsilon([RoundEvent(8 / 1000, 0.9, 3)], 1 / 2500, 2)
    text = out.read_text()
    assert "ε per contributor (contributor-level)" in text and "ε for k problems" in text
    assert f"| people | 2 | 4.00e-04 | 250 (8, 0.900) | {row['pld_epsilon']:.3f} |" in text
    assert f"{c['group_epsilon']:.3f} |" in text


def test_a_calibrated_comparison_targets_the_same_epsilon_at_the_same_delta(tmp_path,
                                                                             monkeypatch):
    """With privacy.epsilon, both levels are calibrated to it at the contributor row's delta
    (so the prompt-level row promises the same epsilon per problem)."""
    from types import SimpleNamespace

    import dpgrpo.privacy.calibration as accounting  # calibrate's module

    calls = []

    def fake_calibrate(n, m, rounds, epsilon, delta):
        calls.append((n, m, rounds, epsilon, delta))
        return SimpleNamespace(sigma={250: 1.2, 1000: 0.8}[n])

    monkeypatch.setattr(accounting, "calibrate", fake_calibrate)
    cfg = apply_overrides(embedded_default(), [
        "data.privacy_unit=contributor", f"data.contributors={_mapping(tmp_path, 4)}",
        "data.per_contributor=4", "data.n_slots=250", "privacy.expected_batch=8",
        "privacy.epsilon=4.0",
        "train.rounds=3"])
    row = resolve_budget(cfg, "people")
    assert calls == [(250, 8, 3, 4.0, 1 / 2500), (1000, 8, 3, 4.0, 1 / 2500)]
    c = row.contributor
    assert (row.sigma, c.prompt_sigma, c.delta) == (1.2, 0.8, 1 / 2500)
    assert c.prompt_epsilon == compute_epsilon(1000, 8, 3, 0.8, 1 / 2500).epsilon
    assert c.group_epsilon == group_epsilon([RoundEvent(8 / 1000, 0.8, 3)], 1 / 2500, 4)
