"""bench/vs_trl.py's baton: the arms' steps never run at the same time.

The benchmark times each arm's steps on the same machine; a step that shares the cores with
another arm's step is timed under that load. Until 2026-12-03 the parent handed the baton to
the next arm as soon as the first one had started, so all three arms' steps ran together.
"""

from __future__ import annotations

import sys
import textwrap
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import vs_trl  # noqa: E402

#: a stand-in arm: model "loaded", then STEPS steps of busy work, each between two batons
STUB = textwrap.dedent("""
    import json, sys, time
    spans = []
    for _ in range({steps}):
        print("@@ready null", flush=True)
        assert sys.stdin.readline().strip() == "go"
        start = time.monotonic()
        while time.monotonic() - start < {seconds}:
            pass
        spans.append((start, time.monotonic()))
    print("@@result " + json.dumps({{"spans": spans}}), flush=True)
""")


def test_one_arm_step_at_a_time_and_every_step_taken():
    commands = {arm: [sys.executable, "-c", STUB.format(steps=3, seconds=0.15)]
                for arm in ("trl", "non-private", "dp-grpo")}
    results = vs_trl.interleave(commands)
    assert sorted(results) == sorted(commands)
    spans = sorted((s, e, arm) for arm, r in results.items() for s, e in r["spans"])
    assert len(spans) == 9
    for (_, end, arm), (start, _, other) in pairwise(spans):
        assert end <= start, f"a step of {other} started before one of {arm} ended"
    order = [arm for _, _, arm in spans]
    assert order[:3] == list(commands), "the arms take turns, in order"


def test_set_and_seed_reach_the_child_command():
    command = vs_trl.arm_command("non-private", Path("m"), Path("w"), 12, 200, trl_seed=7,
                                 sets=["train.clip_nonprivate=false", "train.loss_type=dr_grpo"])
    assert command[command.index("--trl-seed") + 1] == "7"
    sets = [command[i + 1] for i, x in enumerate(command) if x == "--set"]
    assert vs_trl.parse_sets(sets) == {"train.clip_nonprivate": False,
                                       "train.loss_type": "dr_grpo"}


def test_a_set_without_a_key_is_refused():
    for bad in ("train.beta", "=3"):
        with pytest.raises(SystemExit, match="KEY=VALUE"):
            vs_trl.parse_sets([bad])


def test_the_interval_over_runs_counts_the_spread_between_runs():
    # two runs that disagree completely: each run's interval over problems has no width, the
    # interval over runs and problems spans both
    runs = [[True] * 50, [False] * 50]
    assert vs_trl.bootstrap(runs[0])["ci95"] == [1.0, 1.0]
    over = vs_trl.bootstrap_runs(runs, draws=2000)
    assert over["mean"] == 0.5
    assert over["ci95"][0] == 0.0 and over["ci95"][1] == 1.0
    # runs that agree: the interval is the problems' alone
    same = [[i % 4 != 0 for i in range(200)]] * 3
    a, b = vs_trl.bootstrap_runs(same, draws=2000)["ci95"], vs_trl.bootstrap(same[0])["ci95"]
    assert abs(a[0] - b[0]) < 0.03 and abs(a[1] - b[1]) < 0.03


def test_over_runs_reports_each_run_and_the_difference_to_trl():
    repeats = [{"trl": {"correct": [True] * 8 + [False] * 2},
                "non-private": {"correct": [True] * 6 + [False] * 4}},
               {"trl": {"correct": [True] * 10},
                "non-private": {"correct": [True] * 8 + [False] * 2}}]
    out = vs_trl.over_runs(repeats)
    assert out["trl"]["accuracy_per_run"] == [0.8, 1.0]
    assert out["non-private"]["accuracy_mean"] == 0.7
    assert round(out["non-private"]["accuracy_minus_trl"]["mean"], 9) == -0.2
    assert "accuracy_minus_trl" not in out["trl"]


def _saved_run(folder: Path, arm: str, correct: list[bool], ids: list[str] | None = None):
    import json

    out = folder / f"eval-{arm}"
    out.mkdir(parents=True)
    ids = ids or [f"p{i:03d}" for i in range(len(correct))]
    rows = [{"id": i, "scores": {"strict": {"correct": c}}} for i, c in zip(ids, correct)]
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))


def test_pool_counts_every_saved_run_once_across_calls(tmp_path):
    # call 1: two repeats of both arms; call 2: one non-private run; the arms' counts differ
    first, second = tmp_path / "call1", tmp_path / "call2"
    for k, (t, d) in enumerate([(8, 6), (10, 8)]):
        _saved_run(first / f"repeat-{k}", "trl", [True] * t + [False] * (10 - t))
        _saved_run(first / f"repeat-{k}", "non-private", [True] * d + [False] * (10 - d))
    _saved_run(second, "non-private", [True] * 10)
    out = vs_trl.pool([first, second, first])                  # first named twice: counted once
    trl, mine = out["over_runs"]["trl"], out["over_runs"]["non-private"]
    assert out["problems"] == 10
    assert trl["runs"] == 2 and sorted(trl["accuracy_per_run"]) == [0.8, 1.0]
    assert mine["runs"] == 3 and round(mine["accuracy_mean"], 9) == 0.8
    assert round(mine["accuracy_minus_trl"]["mean"], 9) == -0.1
    assert str(second) in mine["folders"]


def test_pool_refuses_runs_over_other_problems(tmp_path):
    _saved_run(tmp_path / "a", "trl", [True, False])
    _saved_run(tmp_path / "b", "trl", [True, False], ids=["p000", "q999"])
    with pytest.raises(SystemExit, match="other problems"):
        vs_trl.pool([tmp_path])
    with pytest.raises(SystemExit, match="no eval"):
        vs_trl.pool([tmp_path / "a" / "eval-trl"])


def test_pool_leaves_out_an_evaluation_still_being_written_and_says_so(tmp_path):
    _saved_run(tmp_path / "done", "trl", [True, False, True, True])
    _saved_run(tmp_path / "running", "trl", [False, False], ids=["p000", "p001"])
    out = vs_trl.pool([tmp_path])
    assert out["problems"] == 4 and out["over_runs"]["trl"]["runs"] == 1
    assert out["over_runs"]["trl"]["accuracy_per_run"] == [0.75]
    [left_out] = out["incomplete_runs_left_out"]
    assert "running" in left_out and "2 of 4 problems" in left_out


# --- --runs K (vs_trl_runs.py): the campaign's schedule and report ------------------------

import vs_trl_runs  # noqa: E402


def test_runs_take_turns_fewest_first_and_never_two_trl_runs_at_once():
    pick = vs_trl_runs.next_variant
    wanted = ["trl-nodrop", "dpgrpo-nodrop-fixed"]
    assert pick(wanted, {}, [], 12) == "trl-nodrop"                  # ties: the given order
    assert pick(wanted, {}, ["trl-nodrop"], 12) == "dpgrpo-nodrop-fixed"
    # the other slot keeps running dpgrpo while TRL runs: TRL's peak RSS twice does not fit
    assert pick(wanted, {"dpgrpo-nodrop-fixed": 5}, ["trl-nodrop"], 12) == "dpgrpo-nodrop-fixed"
    assert pick(wanted, {"trl-nodrop": 3, "dpgrpo-nodrop-fixed": 1}, [], 12) == \
        "dpgrpo-nodrop-fixed"
    assert pick(wanted, {"trl-nodrop": 12, "dpgrpo-nodrop-fixed": 11},
                ["dpgrpo-nodrop-fixed"], 12) is None                   # K reached by all
    assert pick(["trl", "trl-nodrop"], {}, ["trl"], 12) is None       # both TRL: wait
    # --trl-slots 2: a second TRL run may start beside the first, not a third
    assert pick(["trl-nodrop"], {}, ["trl-nodrop"], 12, trl_slots=2) == "trl-nodrop"
    assert pick(["trl-nodrop"], {}, ["trl-nodrop"] * 2, 12, trl_slots=2) is None


def _record(variant: str, correct: list[bool], started: float, version: str = "v1") -> dict:
    return {"variant": variant, "commit": version, "started": started, "correct": correct,
            "accuracy": sum(correct) / len(correct), "seconds_per_step": [1.0, 2.0],
            "peak_rss_bytes": 10**9, "telemetry": [{"reward_mean": 0.2, "cap_rate": 0.8},
                                                   {"reward_mean": 0.4, "cap_rate": 0.5}]}


def test_the_report_counts_failing_runs_and_tests_them_against_trl():
    n = 100
    trl = [_record("trl-nodrop", [i < 90 + k for i in range(n)], k) for k in range(8)]
    bimodal = [_record("dpgrpo-nodrop-fixed", [i < (95 if k % 2 else 40) for i in range(n)],
                       k + 0.5) for k in range(8)]
    out = vs_trl_runs.report(trl + bimodal)["variants"]
    mine = out["dpgrpo-nodrop-fixed"]
    assert mine["runs"] == 8 and mine["below_83"] == 4 and out["trl-nodrop"]["below_83"] == 0
    assert mine["accuracy_mean"] == pytest.approx(0.675)
    assert mine["reward_per_round"] == pytest.approx([0.2, 0.4])
    assert mine["cap_rate_per_round"] == pytest.approx([0.8, 0.5])
    against = mine["against"]
    assert against["versus"] == "trl-nodrop" and against["below_83"] == [4, 8, 0, 8]
    assert against["fisher_p"] == pytest.approx(0.0769, abs=1e-3)    # 4/8 vs 0/8
    diff = against["accuracy_minus_reference"]
    assert diff["mean"] == pytest.approx(0.675 - 0.935)
    assert diff["ci95"][1] < 0                     # the lower mode is far below every TRL run
    lo, hi = mine["accuracy"]["ci95"]              # runs resampled: wide, as the runs differ
    assert hi - lo > 0.3


def test_the_report_pools_one_code_version_unless_asked():
    old = [_record("trl", [True, False], 1.0, "old")]
    new = [_record("trl", [True, True], 2.0, "new")]
    assert vs_trl_runs.report(old + new)["variants"]["trl"]["runs"] == 1
    assert vs_trl_runs.report(old + new)["commit"] == "new"
    assert vs_trl_runs.report(old + new, any_commit=True)["variants"]["trl"]["runs"] == 2


def test_records_accumulate_from_finished_runs_only(tmp_path):
    done = tmp_path / "runs" / "trl" / "a"
    done.mkdir(parents=True)
    vs_trl_runs.write_record(done, _record("trl", [True], 1.0))
    (tmp_path / "runs" / "trl" / "b").mkdir()                        # still running
    found = vs_trl_runs.records(tmp_path)
    assert [r["path"] for r in found] == ["runs/trl/a"]
    assert not (done / "record.json.tmp").exists()


def test_every_dpgrpo_variant_names_a_trl_counterpart_and_valid_overrides():
    import dpgrpo

    for name, variant in vs_trl_runs.VARIANTS.items():
        if variant.library == "dpgrpo":
            assert vs_trl_runs.VARIANTS[variant.versus].library == "trl", name
            dpgrpo.from_trl_config(vs_trl.TRL_OPTIONS, overrides={
                "train.arm": "non-private", **variant.sets}).config()   # loads, or raises


def test_the_dropout_counter_tells_sampling_from_the_loss_pass():
    import torch

    layer = torch.nn.Dropout(0.5)
    before, handle = vs_trl_runs._count_dropout()
    counts = dict(before)
    layer.train()
    with torch.no_grad():
        layer(torch.ones(3))
    layer(torch.ones(3, requires_grad=True))
    layer.eval()
    layer(torch.ones(3))                          # eval mode: does not fire
    torch.nn.Dropout(0.0).train()(torch.ones(3))  # p = 0: does not fire
    handle.remove()
    assert before == {"no_grad": counts["no_grad"] + 1, "grad": counts["grad"] + 1}


def test_the_bisection_variants_each_put_back_one_difference():
    like = vs_trl_runs.VARIANTS["dpgrpo-trl-like"].sets
    assert like == {"train.batch_sampling": "fixed", "train.rollout_dropout": True,
                    "train.share_prompt_pass": False}
    for name, key in (("dpgrpo-d1", "train.rollout_dropout"),
                      ("dpgrpo-d2", "train.share_prompt_pass")):
        sets = vs_trl_runs.VARIANTS[name].sets
        assert {k for k in sets if sets[k] != like[k]} == {key}, name


def test_a_record_names_the_library_versions_it_ran():
    import vs_trl_runs

    versions = vs_trl_runs.library_versions()
    assert set(versions) >= {"torch", "transformers", "peft", "trl"}
    assert versions["torch"] is not None and versions["torch"].split(".")[0].isdigit()
    # a package that is not installed is recorded as None, not left out
    assert all(v is None or isinstance(v, str) for v in versions.values())
