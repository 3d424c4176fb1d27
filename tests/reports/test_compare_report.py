"""dpgrpo.reports.compare on synthetic evaluation outputs with known effects."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from compare_data import STRICT, matrix, write_all, write_eval

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.evaluation import stats
from dpgrpo.reports.compare import Settings, compare_arms, run_compare
from dpgrpo.reports.inputs import load_arms, load_eval_file

FAST = Settings(draws=3_000, sign_draws=4_000, seed=5)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("evals")
    base, dirs = write_all(root)
    cmp, written = run_compare(dirs, base, root / "out", settings=FAST, write_json=True)
    return cmp, written, root / "out"


def test_accuracy_rows_and_deltas(report) -> None:
    cmp, _, out = report
    md = (out / "report.md").read_text()
    assert "| base | 1 | 50.00 | 53.33 |" in md
    assert "| control | 2 | 50.50 (+0.50) | 53.83 (+0.50) |" in md
    assert "| dp-grpo | 2 | 57.50 (+7.50) | 60.83 (+7.50) |" in md
    assert "| sft | 2 | 49.50 (-0.50) | 52.83 (-0.50) |" in md
    assert "| dp-grpo | strict | 1 / 2 | 58.00 / 57.00 | 57.50 |" in md
    assert cmp.focal == "dp-grpo" and cmp.scorers == ("strict", "robust")


def test_focal_contrasts_match_stats(report) -> None:
    _, _, out = report
    data = json.loads((out / "report.json").read_text())
    assert [(c["comparator"], c["scorer"]) for c in data["contrasts"]] == [
        (b, s) for b in ("control", "sft", "base") for s in ("strict", "robust")]
    for row in data["contrasts"]:
        expected = stats.contrast(matrix("dp-grpo", row["scorer"]),
                                  matrix(row["comparator"], row["scorer"]),
                                  draws=3_000, sign_draws=4_000, seed=5).to_dict()
        assert {k: row[k] for k in expected} == expected
    by = {(c["comparator"], c["scorer"]): c for c in data["contrasts"]}
    assert by["control", "strict"]["difference"] == pytest.approx(7.0)
    assert by["control", "strict"]["seeds"]["diffs"] == pytest.approx([8.0, 6.0])
    assert by["sft", "robust"]["seeds"]["diffs"] == pytest.approx([9.0, 7.0])
    assert by["base", "strict"]["seeds"]["diffs"] == pytest.approx([8.0, 7.0])
    assert data["settings"]["draws"] == 3_000 and data["settings"]["seed"] == 5


def test_report_tables_show_intervals_tests_and_mdes(report) -> None:
    cmp, _, out = report
    md = (out / "report.md").read_text()
    ctl = next(r.result for r in cmp.contrasts if (r.comparator, r.scorer) == ("control", "strict"))
    assert f"| control | +7.00 [{ctl.ci[0]:.2f}, {ctl.ci[1]:.2f}] |" in md
    assert "| dp-grpo − control | strict |" in md and "+8.00 / +6.00 | 1.41 |" in md  # noqa: RUF001 - the report writes a minus sign
    assert f"| {max(ctl.holm_p):.2g} |" in md or f"| {max(ctl.holm_p):.1e} |" in md
    # control - base: the interval contains 0, so its MDE is printed beside it
    vb = next(r.result for r in cmp.versus_base if (r.arm, r.scorer) == ("control", "strict"))
    assert vb.ci_contains_zero and vb.mde is not None
    assert f"+0.50 [{vb.ci[0]:.2f}, {vb.ci[1]:.2f}] (MDE {vb.mde:.2f})" in md
    assert ctl.mde is None and "+7.00 [" in md


def test_lengths_and_cap_rates(report) -> None:
    _, _, out = report
    md = (out / "report.md").read_text()
    assert "| dp-grpo | 121.5 | 121.0 / 122.0 | 0.00 | 0.00 / 0.00 |" in md
    assert "| sft | 131.5 | 131.0 / 132.0 | 4.00 | 4.00 / 4.00 |" in md
    assert "| base | 100.0 | 100.0 | 1.00 | 1.00 |" in md


def test_figures_are_pngs(report) -> None:
    _, written, out = report
    names = sorted(p.name for p in written if p.suffix == ".png")
    assert names == ["per_seed_robust.png", "per_seed_strict.png",
                     "versus_base_robust.png", "versus_base_strict.png"]
    for name in names:
        blob = (out / name).read_bytes()
        assert blob[:8] == PNG_MAGIC and len(blob) > 1_000
        assert f"![{name}]({name})" in (out / "report.md").read_text()


def test_without_focal_arm_every_arm_is_contrasted_with_base(tmp_path: Path) -> None:
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    arms = [write_eval(tmp_path / f"c{s}", "control", s, STRICT[("control", s)]) for s in (1, 2)]
    arms.append(write_eval(tmp_path / "sft1", "sft", 1, STRICT[("sft", 1)]))
    base_arm, others = load_arms(arms, base)
    cmp = compare_arms(base_arm, others, FAST)
    assert cmp.focal is None
    assert [(r.arm, r.comparator) for r in cmp.contrasts] == [
        ("control", "base"), ("control", "base"), ("sft", "base"), ("sft", "base")]
    assert cmp.contrasts[0].result.n_seed_pairs == 2
    assert cmp.contrasts[2].result.difference == pytest.approx(-1.0)


def test_seeds_pair_in_order_and_truncate(tmp_path: Path) -> None:
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    grpo = [write_eval(tmp_path / f"g{s}", "dp-grpo", s, STRICT[("dp-grpo", (s - 1) % 2 + 1)])
            for s in (4, 3, 2, 1)]
    sft = [write_eval(tmp_path / f"s{s}", "sft", s, STRICT[("sft", s)]) for s in (2, 1)]
    base_arm, arms = load_arms(grpo + sft, base)
    assert arms[0].seeds == (1, 2, 3, 4) and arms[1].seeds == (1, 2)
    cmp = compare_arms(base_arm, arms, FAST)
    vs_sft = next(r.result for r in cmp.contrasts if (r.comparator, r.scorer) == ("sft", "strict"))
    assert vs_sft.n_seed_pairs == 2 and vs_sft.seeds.diffs == pytest.approx((9.0, 7.0))
    vs_base = next(r.result for r in cmp.contrasts if r.comparator == "base")
    assert vs_base.n_seed_pairs == 4


def test_names_from_labels_and_paths(tmp_path: Path) -> None:
    row = STRICT[("control", 1)]
    run = write_eval(tmp_path / "runs" / "ctl-seed7" / "eval", None, None, row, summary=False)
    assert run.name == "eval"
    f = load_eval_file(tmp_path / "runs" / "ctl-seed7")       # run dir with eval/
    assert (f.arm, f.seed) == ("ctl", 7)
    g = load_eval_file(run / "predictions.jsonl", label="other:3")
    assert (g.arm, g.seed) == ("other", 3)
    h = write_eval(tmp_path / "named", "dp-grpo", 2, row)
    assert (load_eval_file(h, label="ignored:9").arm, load_eval_file(h).seed) == ("dp-grpo", 2)
    with pytest.raises(ConfigError, match="ARM or ARM:SEED"):
        load_eval_file(run, label="bad:")


def test_mismatched_ids_name_both_files(tmp_path: Path) -> None:
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    ids = [f"p{j:03d}" for j in range(299)] + ["q999"]
    other = write_eval(tmp_path / "o", "dp-grpo", 1, STRICT[("dp-grpo", 1)], ids=ids)
    with pytest.raises(DataError) as err:
        load_arms([other], base)
    msg = str(err.value)
    assert str(base / "predictions.jsonl") in msg and str(other / "predictions.jsonl") in msg
    assert "1 missing, 1 extra" in msg


def test_shuffled_ids_are_aligned(tmp_path: Path) -> None:
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    perm = np.random.default_rng(0).permutation(300)
    ids = [f"p{j:03d}" for j in perm]
    row = STRICT[("dp-grpo", 1)]
    other = write_eval(tmp_path / "o", "dp-grpo", 1, row[perm], ids=ids)
    _, (arm,) = load_arms([other], base)
    assert np.array_equal(arm.correct["strict"][0], row)


@pytest.mark.parametrize(("line", "needle"), [
    ("{not json", "line 2: invalid JSON"),
    ('{"id": "p000", "n_tokens": 1, "hit_cap": false, "scores": {"strict": {"correct": true}}}',
     "line 2, field 'id': duplicate problem id"),
    ('{"id": "z", "n_tokens": 1, "hit_cap": false, "scores": {"robust": {"correct": true}}}',
     "line 2, field 'scores'"),
    ('{"id": "z", "n_tokens": 1, "hit_cap": false, "scores": {"strict": {"correct": 1}}}',
     "field 'scores.strict.correct'"),
    ('{"id": "z", "n_tokens": -1, "hit_cap": false, "scores": {"strict": {"correct": true}}}',
     "field 'n_tokens'"),
])
def test_bad_lines_are_located(tmp_path: Path, line: str, needle: str) -> None:
    good = ('{"id": "p000", "n_tokens": 1, "hit_cap": false, '
            '"scores": {"strict": {"correct": true}}}')
    path = tmp_path / "predictions.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError, match=needle.replace("(", r"\(")) as err:
        load_eval_file(path)
    assert str(path) in str(err.value)


def test_duplicate_seed_and_base_name_clash(tmp_path: Path) -> None:
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    a = write_eval(tmp_path / "a", "sft", 1, STRICT[("sft", 1)])
    b = write_eval(tmp_path / "c", "sft", 1, STRICT[("sft", 2)])
    with pytest.raises(DataError, match="seed 1 also given by"):
        load_arms([a, b], base)
    clash = write_eval(tmp_path / "d", "base", 3, STRICT[("sft", 2)])
    with pytest.raises(ConfigError, match="base arm's name"):
        load_arms([clash], base)
    with pytest.raises(ConfigError, match="2 labels for 1 inputs"):
        load_arms([a], base, labels=["x", "y"])
    with pytest.raises(ConfigError):
        Settings(holm_family="everything")  # type: ignore[arg-type]


def test_report_family_holm_pools_all_contrasts(tmp_path: Path) -> None:
    base, dirs = write_all(tmp_path)
    base_arm, arms = load_arms(dirs, base)
    wide = compare_arms(base_arm, arms, Settings(draws=200, sign_draws=200, holm_family="report"))
    flat = [t.p for r in wide.contrasts for t in r.result.mcnemar]
    np.testing.assert_allclose([p for r in wide.contrasts for p in r.result.holm_p],
                               stats.holm(flat))
    assert len(flat) == 12


def test_a_fixed_arm_pairs_with_every_seed_like_the_base(tmp_path: Path) -> None:
    """One fixed model (the study's public warm start) is repeated against every seed of the
    other arm, as the base is, instead of being paired with its first seed only."""
    base = write_eval(tmp_path / "b", "base", 0, STRICT[("base", 0)])
    grpo = [write_eval(tmp_path / f"g{s}", "dp-grpo", s, STRICT[("dp-grpo", s)]) for s in (1, 2)]
    warm = write_eval(tmp_path / "warm" / "eval", "warm-start", None, STRICT[("sft", 1)])
    cmp, _ = run_compare([*grpo, warm], base, tmp_path / "fixed", settings=FAST, figures=False,
                         fixed=[tmp_path / "warm"])
    warm_row = ("warm-start", "strict")
    row = next(r.result for r in cmp.contrasts if (r.comparator, r.scorer) == warm_row)
    focal = np.stack([STRICT[("dp-grpo", 1)], STRICT[("dp-grpo", 2)]]).mean(axis=0)
    assert row.n_seed_pairs == 2
    assert row.difference == pytest.approx(100 * (focal.mean() - STRICT[("sft", 1)].mean()))
    first, _ = run_compare([*grpo, warm], base, tmp_path / "first", settings=FAST, figures=False)
    row1 = next(r.result for r in first.contrasts if (r.comparator, r.scorer) == warm_row)
    assert row1.n_seed_pairs == 1 and row1.difference != row.difference
    # every other arm against the fixed start (what training added to it), in the report too
    assert {(r.arm, r.comparator) for r in cmp.versus_fixed} == {("dp-grpo", "warm-start")}
    strict = next(r for r in cmp.versus_fixed if r.scorer == "strict")
    assert strict.result.difference == row.difference
    assert first.versus_fixed == ()
    assert cmp.to_dict()["versus_fixed"][0]["comparator"] == "warm-start"
    assert "## Each arm against `warm-start`" in (tmp_path / "fixed" / "report.md").read_text()


def test_the_archive_beside_report_json_recomputes_every_interval(report, tmp_path) -> None:
    """predictions.json.gz (committed with the CPU study) holds each seed's 0/1, lengths and
    caps, and no path or text: compare_arms on it alone gives the report's every contrast."""
    import gzip

    from dpgrpo.reports.inputs import read_archive, write_archive

    cmp, written, out = report
    archive = out / "predictions.json.gz"
    assert archive in written
    raw = gzip.decompress(archive.read_bytes()).decode()
    assert str(out.parent) not in raw and "response" not in raw
    base, arms, fixed = read_archive(archive)
    again = compare_arms(base, arms, FAST, fixed=fixed)
    assert again.to_dict()["contrasts"] == cmp.to_dict()["contrasts"]
    def strip(arms: list) -> list:                            # the archive keeps no path
        return [{k: v for k, v in a.items() if k != "paths"} for a in arms]

    assert strip(again.to_dict()["arms"]) == strip(cmp.to_dict()["arms"])
    ids = load_eval_file(out.parent / "base").ids if (out.parent / "base").exists() else \
        [str(i) for i in range(base.n_tokens.shape[1])]
    copy = write_archive(tmp_path / "again.json.gz", ids, base, arms, fixed)
    assert len(archive.read_bytes()) < 20_000                     # 300 problems, 7 rows
    assert copy.read_bytes() == write_archive(tmp_path / "twice.json.gz", ids, base, arms,
                                              fixed).read_bytes()
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="not a predictions archive"):
        read_archive(tmp_path / "bad.json.gz")
