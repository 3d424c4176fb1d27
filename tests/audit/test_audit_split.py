"""The study's DIBA split (issue 58): members drawn at random from public slots, recorded, read
back by the audit, and trained on through ``data.indices``; bad index lists refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgrpo.audit.pipeline import read_candidates
from dpgrpo.config import RunConfig, apply_overrides, config_from_dict
from dpgrpo.config.experiments import StudySettings
from dpgrpo.errors import ConfigError, DataError
from dpgrpo.experiments import study_steps
from dpgrpo.experiments.study_steps import SPLIT_JSON, draw_split, read_split, split_overrides
from dpgrpo.privacy import sampling
from dpgrpo.tasks import load_problems
from dpgrpo.tasks.splits import public_slots

K = 32                     # the study's members: 32 of the first 64 problems


def _config(*overrides: str) -> RunConfig:
    return apply_overrides(config_from_dict({"data": {"task": "arithmetic"}}), list(overrides))


def test_the_split_is_recorded_disjoint_and_covers_the_pool(tmp_path: Path) -> None:
    record = draw_split(tmp_path / SPLIT_JSON, K, _config())
    saved = json.loads((tmp_path / SPLIT_JSON).read_text())
    assert saved == record and saved["pool"] == [0, 2 * K]
    mem, non = saved["members"], saved["nonmembers"]
    assert len(mem) == len(non) == K and not set(mem) & set(non)
    assert sorted(mem + non) == list(range(2 * K))
    problems = load_problems("arithmetic", "train")
    assert saved["member_ids"] == [problems[i].id for i in mem]
    assert saved["nonmember_ids"] == [problems[i].id for i in non]
    assert not set(saved["member_ids"]) & set(saved["nonmember_ids"])
    # a resumed study reads its split back instead of drawing another
    assert draw_split(tmp_path / SPLIT_JSON, K, _config()) == record


def test_two_draws_differ_and_a_fixed_entropy_source_would_not(tmp_path: Path,
                                                              monkeypatch) -> None:
    draws = [draw_split(tmp_path / f"{i}.json", K, _config())["members"] for i in range(3)]
    # C(64, 32) = 1.8e18 splits: a repeat among three OS-entropy draws has probability ~1e-18
    assert len({tuple(d) for d in draws}) == 3
    # the check itself: with the entropy source broken (a constant), the draws coincide
    monkeypatch.setattr(sampling, "read_entropy", lambda n: bytes(n))
    fixed = [draw_split(tmp_path / f"fixed{i}.json", K, _config())["members"] for i in range(2)]
    assert fixed[0] == fixed[1]


def test_the_audited_run_trains_on_the_recorded_members_only(tmp_path: Path) -> None:
    record = draw_split(tmp_path / SPLIT_JSON, K, _config())
    run = apply_overrides(_config("data.limit=32", "audit.canaries=8"), split_overrides(record))
    slots = public_slots(run)
    assert [p.id for p in slots.problems] == record["member_ids"]
    assert (slots.count.n, slots.count.source) == (K + 8, "data.indices")


def test_the_audit_reads_the_recorded_split(tmp_path: Path, monkeypatch) -> None:
    from dpgrpo.audit import pipeline, report

    audits = tmp_path / "audit"
    record = draw_split(audits / SPLIT_JSON, K, _config())
    run = apply_overrides(_config(), split_overrides(record))
    seen: dict[str, object] = {}

    def fake_run_mia(run_dir, members, nonmembers, **kw):
        seen["members"], seen["nonmembers"] = members, nonmembers
        return "outcome"

    monkeypatch.setattr(pipeline, "run_mia", fake_run_mia)
    monkeypatch.setattr(report, "write_mia_report", lambda out, o: {})
    monkeypatch.setattr(report, "mia_summary", lambda o: {"done": o})
    settings = StudySettings(members=K)
    assert study_steps.mia_audit(tmp_path / "run", audits / "private-mia", settings, run) == \
        {"done": "outcome"}
    ids = {side: [p.id for p, _ in read_candidates(str(seen[side]))]
           for side in ("members", "nonmembers")}
    assert ids == {"members": record["member_ids"], "nonmembers": record["nonmember_ids"]}
    # the old fixed split (train[0:32] against train[32:64]) is not what the audit uses
    assert ids["members"] != [p.id for p, _ in read_candidates(f"arithmetic:train[0:{K}]")]
    # a run that did not train on the recorded members is refused, not audited
    other = apply_overrides(_config(), ["data.indices=" + ",".join(map(str, range(K)))])
    with pytest.raises(ConfigError, match="not the members recorded"):
        study_steps.mia_audit(tmp_path / "run", audits / "dp-leaky-mia", settings, other)


def test_a_damaged_or_missing_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not drawn yet"):
        read_split(tmp_path / SPLIT_JSON)
    record = draw_split(tmp_path / SPLIT_JSON, K, _config())
    broken = {**record, "nonmembers": [record["members"][0], *record["nonmembers"][1:]]}
    (tmp_path / SPLIT_JSON).write_text(json.dumps(broken))
    with pytest.raises(DataError, match=r"split.json.*disjoint"):
        read_split(tmp_path / SPLIT_JSON)


@pytest.mark.parametrize("value, message", [
    ("1,1", r"data.indices has duplicates: \[1\]"),
    ("-1", "data.indices must be integers >= 0"),
    ("a", "'data.indices' expects a list of integers"),
    ("1.5", "'data.indices' expects a list of integers"),
])
def test_bad_index_lists_are_refused_naming_the_key(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(f"data.indices={value}")


def test_indices_with_limit_empty_or_past_the_split_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"data.indices and data.limit = 4 both choose"):
        _config("data.limit=4", "data.indices=1,2")
    with pytest.raises(ConfigError, match=r"data.indices = \[\] trains on no problem"):
        config_from_dict({"data": {"task": "arithmetic", "indices": []}})
    size = len(load_problems("arithmetic", "train"))
    with pytest.raises(ConfigError, match=rf"data.indices lists \[{size}\] but split 'train' of "
                                          rf"'arithmetic' has {size} valid problems"):
        public_slots(_config(f"data.indices=0,{size}"))
    with pytest.raises(ConfigError, match="positions must be distinct"):
        read_candidates("arithmetic:train[3,3]")
