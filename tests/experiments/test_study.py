"""`dpgrpo study` end to end on the tiny random model: every step, every key, resumable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpgrpo.cli import app

STUDY_TOML = """
[model]
name = "{model}"
device = "cpu"
lora_rank = 1
target_modules = ["o_proj", "down_proj"]
lora_layers = [-1]
[data]
task = "arithmetic"
limit = 40
[privacy]
expected_batch = 4
epsilon = 8.0
[train]
rounds = 2
group_size = 2
max_new_tokens = 4
checkpoint_every = 2
bound_memory = false
[protocol]
arms = ["dp-grpo", "zero-advantage"]
non_private = true
seeds = 1
eval_limit = 12
draws = 300
sign_draws = 300
[study]
members = 6
audit_samples = 2
audit_max_new_tokens = 4
audit_folds = 2
sweep = [64.0]
dp_leaky = true
workers = 2
audit_permutations = 3
audit_stop_after = 2
[study.leaky]
"train.arm" = "non-private-gold-sft"
"privacy.noise_multiplier" = "none"
"data.limit" = 6
"privacy.expected_batch" = 3
[study.private_audit]
"data.limit" = 6
"privacy.expected_batch" = 3
"audit.canaries" = 4
[study.warm_start]
"train.arm" = "non-private-gold-sft"
"privacy.noise_multiplier" = "none"
"data.task" = "arithmetic-2"
"data.limit" = 6
"privacy.expected_batch" = 3
"""

KEYS = {"nonprivate_gain_pp", "nonprivate_gain_ci", "dp_vs_control_pp", "dp_vs_control_ci",
        "dp_vs_control_mde", "noise_to_signal", "audit_leaky_auc", "audit_leaky_auc_ci",
        "audit_dp_auc", "audit_dp_auc_ci", "canary_eps_lower_bound", "certified_eps",
        "whitebox_eps_lower_bound", "whitebox_count_ceiling", "whitebox_flagged", "wall_seconds"}


def test_study_writes_every_result_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "study.toml"
    config.write_text(STUDY_TOML.format(model=tiny_model_dir))
    out, results = tmp_path / "work", tmp_path / "results"
    args = ["study", str(config), "--out", str(out), "--results", str(results), "--sweep",
            "--quiet"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    record = json.loads((results / "cpu-study.json").read_text())
    assert set(record) >= KEYS, sorted(KEYS - set(record))
    assert len(record["nonprivate_gain_ci"]) == 2 and record["dp_vs_control_mde"] >= 0
    # one seed: no interval over seeds, and the warning that the claims rest on few runs
    assert record["dp_vs_control_seeds"] == 1 and record["dp_vs_control_ci_runs"] is None
    assert "fewer than 5" in first.output and "Few runs" in (results / "cpu-study.md").read_text()
    # every interval recomputable from the results folder; no path of the work folder in it
    from dpgrpo.reports.inputs import read_archive

    _, archived, _ = read_archive(results / "cpu-study-predictions.json.gz")
    assert {a.name for a in archived} >= {"dp-grpo", "zero-advantage", "non-private"}
    for written in ("cpu-study.md", "cpu-study.json"):
        assert str(out) not in (results / written).read_text(), written
    low, high = record["audit_leaky_auc_ci"]
    assert 0.0 <= low <= record["audit_leaky_auc"] <= high <= 1.0
    assert record["certified_eps"] <= 8.0 + 1e-9 and record["canary_eps_lower_bound"] >= 0.0
    # the leaky recipe (gold SFT, sigma = 0) and its private twin at the study's epsilon
    audit = out / "audit"
    leaky_cert = json.loads((audit / "leaky" / "release" / "certificate.json").read_text())
    twin_cert = json.loads((audit / "dp-leaky" / "release" / "certificate.json").read_text())
    assert (leaky_cert["arm"], leaky_cert["private"]) == ("non-private-gold-sft", False)
    assert (twin_cert["arm"], twin_cert["private"]) == ("gold-sft", True)
    assert twin_cert["sigma"] > 0 and twin_cert["epsilon"] <= 8.0 + 1e-9
    assert 0.0 <= record["audit_dp_leaky_auc"] <= 1.0 and "leaky recipe under DP" in \
        (results / "cpu-study.md").read_text()
    # what each certificate allows, from its own ledger
    from dpgrpo.privacy.accounting import PrivacyLedger
    from dpgrpo.privacy.tradeoff import auc_ceiling

    assert record["audit_dp_leaky_auc_ceiling"] == auc_ceiling(
        PrivacyLedger.from_dict(twin_cert["ledger"]).events)
    assert 0.5 < record["audit_dp_leaky_auc_ceiling"] < 1.0
    assert 0.5 < record["audit_dp_auc_ceiling"] < 1.0
    assert "AUC ceiling" in (results / "cpu-study.md").read_text()
    # sigma sqrt(p) / (q n) from the DP-GRPO arm's public certificate
    cert = record["details"]["dp_certificate"]
    assert record["noise_to_signal"] == (cert["sigma"] * cert["trainable_coordinates"] ** 0.5
                                         / cert["expected_batch"])
    assert [s["epsilon"] for s in record["sweep"]] == [record["details"]["sweep"][0]["epsilon"]]
    assert 0 < record["wall_seconds_without_sweep"] <= record["wall_seconds"]
    page = (results / "cpu-study.md").read_text()
    assert "## Contrasts" in page and "## Audits" in page and "## Steps" in page
    # the white-box mechanism audit at the DP-GRPO run's certificate passes the real mechanism
    assert record["whitebox_flagged"] is False and "White-box mechanism audit" in page
    assert 0.0 <= record["whitebox_eps_lower_bound"] <= record["dp_grpo_certified_eps"]
    assert record["whitebox_eps_lower_bound"] <= record["whitebox_count_ceiling"] + 1e-3
    assert any(p.name.startswith("cpu-study-") and p.suffix == ".png" for p in results.iterdir())
    steps = [r["step"] for r in record["details"]["steps"]]
    assert len(steps) >= 9 and all(r["peak_rss_bytes"] > 0 for r in record["details"]["steps"])
    # study.workers = 2: the tasks ran in two worker processes, each with its own record
    assert {"non-private-seed1: train (2 rounds)", "dp-grpo-seed1: evaluate", "base: evaluate",
            "sweep eps=64: train", "canary audit (one-run lower bound)"} <= set(steps)
    pids = {r["pid"] for r in record["details"]["steps"]}
    assert len(pids - {os.getpid()}) == 2, pids
    assert {p.stem for p in (out / "steps").glob("*.json")} >= {"private", "leaky", "dp-leaky",
                                                                 "base", "non-private-seed1"}
    assert "2 worker processes" in page
    # the three DIBA audits (one base, one task) read the base's samples drawn once, first
    assert len(list((out / "audit" / "base-samples").glob("*.json"))) == 1
    assert steps.count("DIBA: the base model's samples (arithmetic)") == 1
    # each DIBA audit's permutation test, in its own task once the audit saved its features
    for key in ("audit_leaky_auc", "audit_dp_auc", "audit_dp_leaky_auc"):
        assert 1 / 4 <= record[f"{key}_p"] <= 1 and len(record[f"{key}_null"]) == 2, key
    assert {"permutation test of the leaky audit", "permutation test of the DP-GRPO audit"} \
        <= set(steps)
    summary = json.loads((out / "audit" / "leaky-mia" / "summary.json").read_text())
    assert summary["permutation"]["permutations"] == 3 and "permutation p =" in page
    # stopped by Besag and Clifford's rule at study.audit_stop_after = 2
    assert summary["permutation"]["stop_after"] == 2 and record["audit_leaky_auc_stop_after"] == 2
    assert record["audit_leaky_auc_draws"] == summary["permutation"]["draws"] <= 3
    assert "Besag and Clifford" in page and "of at most 3 shuffles" in page
    assert "## Permutation test" in (out / "audit" / "leaky-mia" / "report.md").read_text()
    # the public warm start: trained first, every protocol arm starts from its adapter (the
    # certificates record its sha256), the audit runs do not, and it is scored beside the arms
    from dpgrpo.model import adapter_digest

    digest = adapter_digest(out / "warm-start" / "release")
    for run in ("runs/dp-grpo-seed1", "runs/zero-advantage-seed1", "runs/non-private-seed1",
                "sweep/dp-grpo-eps64"):
        path = out / run / "release" / "certificate.json"
        assert json.loads(path.read_text())["adapter"]["init_adapter"]["sha256"] == digest, run
    assert leaky_cert["adapter"]["init_adapter"] is None
    assert twin_cert["adapter"]["init_adapter"] is None
    warm_cert = json.loads((out / "warm-start" / "release" / "certificate.json").read_text())
    assert (warm_cert["arm"], warm_cert["private"]) == ("non-private-gold-sft", False)
    arms = {a["name"]: a for a in record["details"]["report"]["arms"]}
    assert record["warm_start_gain_pp"] == (record["warm_start_accuracy"]
                                            - arms["base"]["accuracy"]["strict"])
    assert "warm-start" in arms and len(record["dp_vs_warm_start_ci"]) == 2
    # the control against its own start (what noise and the KL term alone do to it)
    assert record["control_vs_warm_start_pp"] == pytest.approx(
        arms["zero-advantage"]["accuracy"]["strict"] - record["warm_start_accuracy"])
    assert len(record["control_vs_warm_start_ci"]) == 2 and "control against the same" in page
    assert json.loads((out / "runs/dp-grpo-seed1/release/certificate.json").read_text())[
        "adapter"]["kl_reference"] == "start"
    assert "public warm start" in page
    assert {"public warm start: train", "public warm start: evaluate"} <= set(steps)
    # a rerun finds everything done: the same results, no new training
    journal = out / "audit" / "leaky" / "recovery" / "journal.jsonl"
    before = journal.read_text()
    again = CliRunner().invoke(app, [*args, "--workers", "1", "--no-dp-leaky"])
    assert again.exit_code == 0, again.output
    assert journal.read_text() == before
    assert "audit_dp_leaky_auc" not in json.loads((results / "cpu-study.json").read_text())
    assert json.loads((results / "cpu-study.json").read_text())["audit_leaky_auc"] == \
        record["audit_leaky_auc"]


def test_an_epsilon_the_gate_refuses_is_reported_not_fatal(monkeypatch, tmp_path: Path) -> None:
    """A sweep epsilon whose certificate cannot be made (the noise-tail gate) is a row saying so."""
    from types import SimpleNamespace

    import dpgrpo.experiments.study_steps as study
    from dpgrpo.config import RunConfig
    from dpgrpo.errors import PrivacyError

    def refuse(config, run_dir):
        raise PrivacyError("the noise generator's truncated tails add 1e+23 to delta")

    monkeypatch.setattr(study, "train_once", refuse)
    runs = [SimpleNamespace(arm="dp-grpo", config=RunConfig()),
            SimpleNamespace(arm="zero-advantage", config=RunConfig())]
    plan = SimpleNamespace(runs=runs, out_dir=tmp_path)
    steps = study.Steps(lambda message: None, tmp_path / "steps.json")
    row = study.sweep_point(plan, 128.0, steps)
    assert row == {"epsilon": 128.0,
                   "refused": "the noise generator's truncated tails add 1e+23 to delta"}
    assert steps.rows == [] and not (tmp_path / "sweep" / "dp-grpo-eps128").exists()


def test_a_study_folder_holding_another_run_is_refused(tiny_model_dir: Path, tmp_path: Path):
    """The study resumes a run only if its folder holds the same config: a changed leaky recipe
    in an old output folder must not continue the old run under the new name."""
    import pytest

    from dpgrpo.config import apply_overrides, config_from_dict, read_toml
    from dpgrpo.errors import ConfigError
    from dpgrpo.experiments.study import private_twin
    from dpgrpo.experiments.study_steps import train_once

    config = tmp_path / "study.toml"
    config.write_text(STUDY_TOML.format(model=tiny_model_dir))
    data = read_toml(config)
    data.pop("study"), data.pop("protocol")
    cfg = apply_overrides(config_from_dict(data), ["train.rounds=1", "data.limit=6"])
    train_once(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="trained with another config"):
        train_once(apply_overrides(cfg, ["train.rounds=2"]), tmp_path / "run")
    with pytest.raises(ConfigError, match="no private twin"):
        private_twin(apply_overrides(cfg, ["train.arm=dp-grpo"]))


def test_a_warm_start_on_the_private_training_data_is_refused(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """The warm start is public input, outside the arms' certificates: the study refuses one
    that trains on its own training split (or learns its eval split) before any work."""
    import pytest

    from dpgrpo.errors import ConfigError, PrivacyError
    from dpgrpo.experiments.study import _Study

    text = STUDY_TOML.format(model=tiny_model_dir)
    config = tmp_path / "study.toml"
    config.write_text(text.replace('"data.task" = "arithmetic-2"', '"data.task" = "arithmetic"'))
    with pytest.raises(PrivacyError, match="own training data"):
        _Study.load(config, tmp_path / "w")
    config.write_text(text.replace('"data.task" = "arithmetic-2"',
                                   '"data.task" = "arithmetic"\n"data.split" = "eval"'))
    with pytest.raises(ConfigError, match="eval split"):
        _Study.load(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()
    config.write_text(text)                                     # level 2: another public task
    plan = _Study.load(config, tmp_path / "w").plan
    assert plan.references == ((tmp_path / "w" / "warm-start").resolve(),)
    assert {r.config.model.init_adapter for r in plan.runs} == {
        str((tmp_path / "w" / "warm-start" / "release").resolve())}


def test_a_warm_start_is_compared_with_the_study_by_content(tmp_path: Path) -> None:
    """Issue 56: another task name is not enough. A warm start whose training questions are in
    the study's training set (up to case, whitespace or a shared 13-word run) is refused with
    the count (PublicDataError); one holding eval questions is refused too (ConfigError); a
    disjoint one is accepted."""
    from dpgrpo.config import load_config
    from dpgrpo.errors import ConfigError, PublicDataError
    from dpgrpo.experiments.study import check_public_warm_start
    from dpgrpo.tasks import load_problems

    study = load_config(None, ["data.task=arithmetic"])
    warm = ["train.arm=non-private-gold-sft", "privacy.noise_multiplier=none"]
    level2 = load_config(None, [*warm, "data.task=arithmetic-2", "data.limit=100"])
    with pytest.raises(PublicDataError, match=r"\('arithmetic-2', split 'train'\): 17 of its 100 "
                                              r"questions are in the study's private training"):
        check_public_warm_start(level2, study, "eval")
    evals = [p.question for p in load_problems("arithmetic", "eval")]
    rows = [evals[1].upper(), "  " + evals[3], "How many legs do 3 spiders have?"]  # eval only
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text("".join(
        json.dumps({"question": q, "answer": "1\n#### 1"}) + "\n" for q in rows))
    held = load_config(None, [*warm, "data.task=gsm8k", f"data.data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="2 of its 3 questions are in the study's eval set"):
        check_public_warm_start(held, study, "eval")
    check_public_warm_start(load_config(None, [*warm, "data.task=arithmetic-proxy"]), study,
                            "eval")


def test_steps_keep_the_time_of_the_run_that_did_the_work(tmp_path: Path) -> None:
    from dpgrpo.experiments.study import Steps

    record = tmp_path / "steps.json"
    first = Steps(lambda message: None, record)
    first.run("train", lambda: sum(range(3_000_000)))
    done = first.rows[0]["seconds"]
    again = Steps(lambda message: None, record)       # a resumed study: the step is skipped
    again.run("train", lambda: None)
    assert [r["step"] for r in again.rows] == ["train"] and again.rows[0]["seconds"] == done
    assert json.loads(record.read_text())[0]["seconds"] == done and again.wall == done


def test_the_wall_time_counts_overlapping_steps_once(tmp_path: Path) -> None:
    """Workers run steps at once: the wall time is the union of their spans, not the sum."""
    from dpgrpo.experiments.study import Steps

    rows = [{"step": "a", "seconds": 10.0, "start": 100.0, "peak_rss_bytes": 1},
            {"step": "b", "seconds": 10.0, "start": 105.0, "peak_rss_bytes": 1},   # overlaps a
            {"step": "c", "seconds": 5.0, "start": 200.0, "peak_rss_bytes": 1},    # later, apart
            {"step": "d", "seconds": 2.0, "peak_rss_bytes": 1}]                    # no start
    (tmp_path / "w1.json").write_text(json.dumps(rows[:1] + rows[2:]))
    (tmp_path / "w2.json").write_text(json.dumps(rows[1:2]))
    steps = Steps(lambda message: None, tmp_path / "main.json",
                  others=[tmp_path / "w1.json", tmp_path / "w2.json"])
    assert sorted(r["step"] for r in steps.rows) == ["a", "b", "c", "d"]
    assert steps.wall == 15.0 + 5.0 + 2.0
    assert steps.wall_of(lambda name: name != "a") == 10.0 + 5.0 + 2.0


def test_tasks_start_once_what_they_start_from_is_done() -> None:
    """The warm start runs beside the audits (no worker idles while it trains); every arm,
    sweep point and the warm start's evaluation wait for it, each permutation test for its
    audit; otherwise the list order (longest first) decides."""
    from types import SimpleNamespace

    from dpgrpo.experiments.study import _prerequisite
    from dpgrpo.experiments.study_pool import _next_tasks

    st = SimpleNamespace(plan=SimpleNamespace(runs=[SimpleNamespace(name="dp-grpo-seed1"),
                                                    SimpleNamespace(name="non-private-seed1")]))
    names = ["warm-start", "audit-base", "private", "leaky", "dp-grpo-seed1",
             "non-private-seed1", "sweep-eps64", "base", "warm-start-eval",
             "private-mia-permutation", "leaky-mia-permutation"]
    after = {n: _prerequisite(st, n, names) for n in names}
    assert after == {"warm-start": None, "audit-base": None, "private": "audit-base",
                     "leaky": "audit-base", "base": None,
                     "dp-grpo-seed1": "warm-start", "non-private-seed1": "warm-start",
                     "sweep-eps64": "warm-start", "warm-start-eval": "warm-start",
                     "private-mia-permutation": "private", "leaky-mia-permutation": "leaky"}
    assert _next_tasks(names, after, set(), 2) == ["warm-start", "audit-base"]
    rest = [n for n in names if n not in ("warm-start", "audit-base")]
    assert _next_tasks(rest, after, set(), 1) == ["base"]      # the audited runs wait too
    assert _next_tasks(rest, after, {"audit-base"}, 2) == ["private", "leaky"]
    assert _next_tasks(rest, after, {"warm-start"}, 2) == ["dp-grpo-seed1",
                                                           "non-private-seed1"]
    assert _next_tasks(["leaky-mia-permutation"], after, {"private"}, 2) == []
    # without a warm start nothing waits for one; without the base's samples, neither
    plain = [n for n in names if not n.startswith(("warm-start", "audit-base"))]
    assert all(_prerequisite(st, n, plain) is None for n in plain if "permutation" not in n)


def test_seeds_sets_the_runs_of_every_trained_arm(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--seeds N` gives N runs of the private arms and of non-private GRPO (whose one run can
    take off or not: the study's non-private claim needs several)."""
    from dpgrpo.experiments.study import _Study

    config = tmp_path / "study.toml"
    config.write_text(STUDY_TOML.format(model=tiny_model_dir))
    names = [r.name for r in _Study.load(config, tmp_path / "w").plan.runs]
    assert names == ["dp-grpo-seed1", "zero-advantage-seed1", "non-private-seed1"]
    names = [r.name for r in _Study.load(config, tmp_path / "w", {"seeds": 2}).plan.runs]
    assert names == [f"{arm}-seed{k}" for arm in ("dp-grpo", "zero-advantage", "non-private")
                     for k in (1, 2)]


def test_the_stopping_rule_key_and_old_records_of_the_permutation_test() -> None:
    """study.audit_stop_after is checked; summaries and records saved before the rule (no
    draws, no stop_after) still give the page's sentence, as the fixed tests they were."""
    import pytest

    from dpgrpo.config.loading import load_study_table
    from dpgrpo.errors import ConfigError
    from dpgrpo.experiments.study_steps import StudySettings
    from dpgrpo.experiments.study_summary import _permuted
    from dpgrpo.reports.study import _perm

    assert StudySettings().audit_stop_after == 10
    assert load_study_table({"audit_stop_after": 0}).audit_stop_after == 0
    with pytest.raises(ConfigError, match=r"study.audit_stop_after"):
        load_study_table({"audit_stop_after": -1})
    old = {"permutation": {"permutations": 50, "p_value": 0.02, "null_band": [0.3, 0.6]}}
    keys = _permuted("audit_leaky_auc", old)
    assert (keys["audit_leaky_auc_draws"], keys["audit_leaky_auc_stop_after"]) == (50, None)
    assert _perm(keys, "audit_leaky_auc") == \
        ", permutation p = 0.02 (50 shuffles, null 95% [0.300, 0.600])"
    record = {"audit_leaky_auc_p": 0.02, "audit_leaky_auc_null": [0.3, 0.6]}   # before the keys
    assert _perm(record, "audit_leaky_auc") == ", permutation p = 0.02 (null 95% [0.300, 0.600])"
    new = {"permutation": {**old["permutation"], "p_value": 10 / 12, "draws": 12,
                           "stop_after": 10}}
    assert "12 of at most 50 shuffles, stop at 10" in _perm(_permuted("k", new), "k")


def test_the_page_gives_claims_over_seeds_labels_seed_lines_and_names_no_machine_path(
        tmp_path: Path) -> None:
    """Issue 55: each headline interval over problems and over seeds and problems, a warning
    below 5 seeds, per-seed lines labelled by their contrast, both retention shares, and no
    absolute path of the machine in the page or the record."""
    from dpgrpo.reports.study import (
        _few_seeds,
        _over_runs,
        _seed_spread,
        _share_over_start,
        relative_paths,
    )

    s = {"dp_vs_control_ci_runs": [-4.0, 33.8], "dp_vs_control_seed_p": 0.2566,
         "dp_vs_control_seeds": 3, "nonprivate_gain_seeds": 3}
    assert _over_runs(s, "dp_vs_control") == (" over problems, **[-4.0, 33.8] over seeds and "
                                              "problems** (Welch's t over seeds p = 0.26)")
    assert _over_runs({}, "dp_vs_control") == ""                     # an old record
    assert "3 seeds of an arm, fewer than 5" in _few_seeds(s)[0]
    assert _few_seeds({**s, "dp_vs_control_seeds": 5, "nonprivate_gain_seeds": 6}) == []
    row = {"arm": "dp-grpo", "comparator": "zero-advantage", "scorer": "strict",
           "seeds": {"diffs": [-13.5, 29.0, 32.5], "t_interval": [-47.6, 79.6]}}
    report = {"contrasts": [row], "versus_base": []}
    assert _seed_spread(report).startswith("; per seed of dp-grpo - zero-advantage: -13.5, ")
    share = _share_over_start({"warm_start_accuracy": 52.0, "retained_share_over_warm_start":
                               0.42, "warm_start_share_of_dp_gain": 0.74})
    assert share == (" and **42%** of its gain over the common public warm start; the warm "
                     "start alone gives 74% of DP-GRPO's gain over the base")
    out = tmp_path / "work"
    record = relative_paths({"out_dir": str(out), "model": {
        "init_adapter": str(out / "warm-start" / "release")}, "name": "smollm2-135m",
        "cwd_file": str(Path.cwd() / "configs" / "cpu-study.toml")}, out)
    assert record == {"out_dir": ".", "model": {"init_adapter": "warm-start/release"},
                      "name": "smollm2-135m", "cwd_file": "configs/cpu-study.toml"}


def test_a_claim_against_a_fixed_model_counts_the_trained_arms_seeds() -> None:
    """The base and the warm start are one row by design: five seeds against the base rest on
    five seeds, not one (the warning counted 1 on the five-seed study of 2026-12-06)."""
    from dpgrpo.experiments.study_summary import _contrast

    rows = [{"arm": "non-private", "comparator": "base", "scorer": "strict", "difference": 55.4,
             "ci": [49.2, 61.4], "se": 3.0, "accuracy_a": 72.4, "accuracy_b": 17.0,
             "n_seeds": [5, 1]},
            {"arm": "dp-grpo", "comparator": "zero-advantage", "scorer": "strict",
             "difference": 11.3, "ci": [7.0, 15.5], "se": 2.0, "accuracy_a": 55.1,
             "accuracy_b": 43.8, "n_seeds": [5, 3]}]
    report = {"base": "base", "contrasts": rows[1:], "versus_base": rows[:1]}
    assert _contrast(report, "non-private", "base")["seeds"] == 5
    assert _contrast(report, "dp-grpo", "zero-advantage")["seeds"] == 3


def test_the_summary_and_page_carry_the_two_sided_p_of_a_diba_test() -> None:
    """Issue 58: an AUC far below its null (all 20 shuffles above it) is a signal; the summary
    keeps the lower tail's and the two-sided p beside the upper one, and the page gives the
    two-sided p. A test drawn one-sided (saved before 2026-12) has none and the page says so
    by leaving it out."""
    import numpy as np

    from dpgrpo.audit.mia import PermutationTest
    from dpgrpo.experiments.study_summary import _permuted
    from dpgrpo.reports.study import _perm

    null = np.linspace(0.45, 0.64, 20)                     # every null AUC above the observed
    test = PermutationTest(observed=0.30, null=null, seed=0, permutations=20, stop_after=None)
    keys = _permuted("audit_dp_auc", {"permutation": test.to_dict()})
    assert keys["audit_dp_auc_p"] == 1.0                   # upper tail: 21 / 21
    assert keys["audit_dp_auc_p_lower"] == 1 / 21
    assert keys["audit_dp_auc_p_two_sided"] == 2 / 21
    line = _perm(keys, "audit_dp_auc")
    assert line.startswith(", permutation p = 1, two-sided p = 0.095 (20 shuffles, ")
    one_sided = {"permutation": {"permutations": 20, "p_value": 1.0, "null_band": [0.4, 0.6]}}
    keys = _permuted("audit_dp_auc", one_sided)
    assert keys["audit_dp_auc_p_two_sided"] is None
    assert "two-sided" not in _perm(keys, "audit_dp_auc")


def test_the_study_page_gives_the_f_dp_bound_the_rounds_independence_and_the_verdict(
        monkeypatch) -> None:
    """Issue 58: the page's white-box sentence, from real audits (the operating point's q, T and
    sigma, 4,000 canaries): the f-DP bound beside the count-based one, the rounds' noises
    independent and the verdict for the real mechanism; with a round key drawn once, the
    sentence names the independence check as what flagged it."""
    import json

    from dpgrpo.audit.mechanism_audit import audit_mechanism
    from dpgrpo.audit.whitebox import AuditSetup
    from dpgrpo.privacy import noise
    from dpgrpo.reports.study import _whitebox_sentence

    setup = AuditSetup(n=5000, q=0.016, rounds=12, sigma=0.38064, clip_norm=0.055,
                       delta=1e-4, coordinates=4096, canaries=4000, certified_epsilon=8.0)
    record = json.loads(json.dumps(audit_mechanism(setup, seed=21, calibrate=True).to_dict()))
    text = _whitebox_sentence(record)
    bound = record["fdp_bound"]["epsilon_lower_bound"]
    assert f"The f-DP one-run bound (the {record['fdp_bound']['r']} most confident" in text
    assert f"{bound:.3f} at delta' against the certificate's" in text
    assert "The rounds' noises: independent (max |z|" in text
    assert text.endswith("Verdict: passed.")
    real = noise.seeded_key
    monkeypatch.setattr(noise, "seeded_key", lambda seed, round_index: real(seed, 0))
    reused = json.loads(json.dumps(audit_mechanism(setup, seed=21).to_dict()))
    text = _whitebox_sentence(reused)
    assert "The rounds' noises: correlated, flagged by" in text
    assert "Verdict: FLAGGED by noise independence across rounds." in text
