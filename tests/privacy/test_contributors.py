"""Contributor-level DP without a model: public contributor slots, the hidden choice of k
problems, per-contributor sums that stay within one contributor, and sensitivity C."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from dpgrpo.errors import ConfigError, DataError, PrivacyError
from dpgrpo.privacy.contributors import (
    Contributor,
    ProblemChooser,
    as_contributors,
    contributor_slot_count,
    round_prompts,
    sum_within_records,
    unit_description,
)
from dpgrpo.privacy.mechanism import clip_and_sum
from dpgrpo.tasks.base import LoadedSplit, Problem
from dpgrpo.tasks.contributors import assign_contributors, contributor_slots, read_contributor_map


def _problems(n: int, owners: list[str] | None = None) -> list[Problem]:
    return [Problem(f"p{i}", f"q{i}", str(i), contributor=None if owners is None else owners[i])
            for i in range(n)]


# --- public n ---------------------------------------------------------------------------------

def test_contributor_slots_follow_the_public_n_rules():
    count = contributor_slot_count(n_slots=20, contributors=12, canaries=2)
    assert (count.n, count.source, count.records) == (20, "data.n_slots", 14)
    with pytest.raises(ConfigError, match="n_slots = 13 is smaller than the 14"):
        contributor_slot_count(n_slots=13, contributors=12, canaries=2)
    with pytest.raises(ConfigError, match=r"needs data.n_slots.*contributor count is private"):
        contributor_slot_count(n_slots=None, contributors=12, canaries=2)


def test_slot_layout_groups_problems_by_contributor_in_file_order(tmp_path):
    owners = ["ann", "bob", "ann", "cy", "bob", "ann", "dee"]
    loaded = LoadedSplit(_problems(7, owners), skipped=(DataError("bad"),))
    data = SimpleNamespace(contributors=None, split="train", limit=None, n_slots=6)
    task = SimpleNamespace(name="t")
    slots, count = contributor_slots(data, task, loaded, canaries=1)
    assert count.n == 6 and count.source == "data.n_slots"  # 4 contributors, 1 absent, canary
    assert [s.id for s in slots[:4]] == ["ann", "bob", "cy", "dee"] and slots[4] is None
    assert len(slots) == 5  # the canary slot comes after
    assert [p.id for _, p in slots[0].problems] == ["p0", "p2", "p5"]
    assert all(t is task for s in slots[:4] for t, _ in s.problems)
    for bad, message in (({"n_slots": None}, "needs data.n_slots"),
                         ({"limit": 3}, "data.limit is refused")):
        with pytest.raises(ConfigError, match=message):
            contributor_slots(SimpleNamespace(**{**vars(data), **bad}), task, loaded, canaries=0)
    canary = (task, Problem("canary-0", "q", "1"))
    assert as_contributors([canary, None]) == [Contributor("canary-0", (canary,)), None]
    assert unit_description("contributor", 3) == "one contributor (up to 3 problems per round)"


# --- the mapping file -------------------------------------------------------------------------

def test_mapping_files_jsonl_and_csv(tmp_path):
    jsonl = tmp_path / "map.jsonl"
    jsonl.write_text('{"id": "p0", "contributor": "ann"}\n\n{"id": "p1", "contributor": 7}\n')
    csv = tmp_path / "map.csv"
    csv.write_text("contributor,id\nann,p0\n7,p1\n")
    assert read_contributor_map(jsonl) == read_contributor_map(csv) == {"p0": "ann", "p1": "7"}
    problems = assign_contributors(_problems(2, ["zed", None]), {"p0": "ann", "p1": "7"},
                                   source="map")
    assert [p.contributor for p in problems] == ["ann", "7"]  # the mapping decides
    with pytest.raises(DataError, match="'p1' has no contributor"):
        assign_contributors(_problems(2, ["ann", None]), None, source="train.jsonl")


@pytest.mark.parametrize("name, text, message", [
    ("m.jsonl", '{"id": "p0", "contributor": "a"}\n{"id": "p0", "contributor": "b"}\n',
     "line 2, field 'id': problem 'p0' is mapped to two contributors"),
    ("m.jsonl", '{"id": "p0"}\n', "line 1, field 'contributor'"),
    ("m.jsonl", '{"id": "p0", "contributor": ""}\n', "line 1, field 'contributor'"),
    ("m.jsonl", '{"id": true, "contributor": "a"}\n', "line 1, field 'id'"),
    ("m.jsonl", "not json\n", "line 1: invalid JSON"),
    ("m.csv", "problem,who\np0,a\n", "line 1, field 'id'"),
    ("m.csv", "id,contributor\np0,\n", "line 2, field 'contributor'"),
    ("m.txt", "p0 a\n", "a .jsonl or .csv file"),
])
def test_mapping_errors_name_file_line_and_field(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=message) as err:
        read_contributor_map(path)
    assert str(path) in str(err.value)


def test_a_contributor_field_in_the_data_file_is_read(tmp_path):
    from dpgrpo.tasks import load_problems

    folder = tmp_path / "gsm8k"
    folder.mkdir()
    rows = [{"question": "1+1?", "answer": "2\n#### 2", "contributor": "ann"},
            {"question": "2+2?", "answer": "4\n#### 4", "contributor": 5},
            {"question": "3+3?", "answer": "6\n#### 6"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems("gsm8k", "train", tmp_path)
    assert [p.contributor for p in problems] == ["ann", "5", None]
    rows[1]["contributor"] = ["x"]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="line 2, field 'contributor'"):
        load_problems("gsm8k", "train", tmp_path)


# --- which k problems: hidden randomness ------------------------------------------------------

def test_the_k_problems_are_chosen_from_os_entropy_128_bits_each():
    calls: list[int] = []
    keys = [b"\x05" * 16, b"\x01" * 16, b"\x09" * 16, b"\x02" * 16, b"\x07" * 16]

    def entropy(nbytes: int) -> bytes:
        calls.append(nbytes)
        return b"".join(keys)

    chooser = ProblemChooser(2, entropy=entropy)
    assert chooser.choose(5) == [1, 3] and calls == [5 * 16]   # the two smallest keys
    assert chooser.choose(2) == [0, 1] and calls == [80]       # <= k problems: all, no draw
    assert chooser.releasable and chooser.state_dict() == {"source": "os-entropy"}
    default = ProblemChooser(3)
    draws = {tuple(default.choose(400)) for _ in range(20)}  # C(400, 3) ~ 1e7: no repeats
    assert len(draws) == 20 and all(len(d) == 3 for d in draws)  # fresh every round
    with pytest.raises(PrivacyError, match="returned 3 bytes"):
        ProblemChooser(1, entropy=lambda n: b"abc").choose(4)
    with pytest.raises(ConfigError):
        ProblemChooser(0)


def test_the_choice_is_a_uniform_k_subset():
    chooser = ProblemChooser(2)
    counts = Counter(tuple(chooser.choose(4)) for _ in range(6000))
    assert set(counts) == set(itertools.combinations(range(4), 2))
    assert all(abs(c - 1000) < 4 * 30 for c in counts.values()), counts  # 4 sigma, sd ~ 29


def test_a_seeded_chooser_is_reproducible_not_releasable_and_restorable():
    a, b = ProblemChooser(3, seed=5), ProblemChooser(3, seed=5)
    first = [a.choose(10) for _ in range(3)]
    assert first == [b.choose(10) for _ in range(3)] and not a.releasable
    state = a.state_dict()
    following = a.choose(10)
    c = ProblemChooser(3, seed=99)
    c.load_state_dict(state)
    assert c.choose(10) == following


# --- one gradient per contributor -------------------------------------------------------------

def test_round_prompts_per_unit():
    prompt_records = [("t", Problem("a", "q", "1")), ("t", Problem("b", "q", "2"))]
    plan = round_prompts(prompt_records, None)
    assert plan.prompts == prompt_records and plan.bounds == (0, 1, 2) and plan.one_per_record
    people = [Contributor("x", tuple(("t", Problem(f"x{i}", "q", "1")) for i in range(5))),
              Contributor("y", (("t", Problem("y0", "q", "1")),))]
    plan = round_prompts(people, ProblemChooser(2, seed=0))
    assert plan.bounds == (0, 2, 3) and plan.num_records == 2 and not plan.one_per_record
    assert {p.id for _, p in plan.prompts[:2]} < {f"x{i}" for i in range(5)}
    assert plan.prompts[2][1].id == "y0"
    assert round_prompts([], ProblemChooser(2)).num_records == 0


def _per_prompt(rows: list[list[float]]) -> dict[str, torch.Tensor]:
    t = torch.tensor(rows, dtype=torch.float32)
    return {"a": t[:, :2].contiguous(), "b": t[:, 2:].reshape(-1, 1, 2).contiguous()}


def test_sums_stay_within_each_contributor_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 4, generator=gen).tolist()
    plan = round_prompts([Contributor("x", (1, 2, 3)), Contributor("y", (4,)),
                          Contributor("z", (5, 6))], ProblemChooser(9))
    out = sum_within_records(_per_prompt(rows), plan)
    assert out["a"].shape == (3, 2) and out["b"].shape == (3, 1, 2)
    grads = _per_prompt(rows)
    for name in grads:
        for r, (lo, hi) in enumerate([(0, 3), (3, 4), (4, 6)]):
            expected = grads[name][lo].clone()
            for j in range(lo + 1, hi):
                expected += grads[name][j]
            assert torch.equal(out[name][r], expected)
    # another contributor's prompts (more, fewer, different) leave "z" bit-identical
    other = round_prompts([Contributor("w", (1, 2, 3, 4, 5)), Contributor("z", (5, 6))],
                          ProblemChooser(9))
    changed = torch.randn(5, 4, generator=gen).mul(1e6).tolist() + rows[4:]
    again = sum_within_records(_per_prompt(changed), other)
    assert all(torch.equal(again[n][1], out[n][2]) for n in out)
    single = _per_prompt(rows[:2])
    assert sum_within_records(single, round_prompts([("t", 1), ("t", 2)], None)) is single
    with pytest.raises(PrivacyError, match="per-prompt gradients for"):
        sum_within_records(_per_prompt(rows[:5]), plan)


def test_sensitivity_of_a_contributor_with_many_problems_stays_at_most_c():
    """A contributor owning 50 problems whose gradients all point the same way moves the
    clipped sum by at most C; clipping each of its k prompts instead would move it k C."""
    clip, k = 0.5, 8
    gen = torch.Generator().manual_seed(1)
    others = [Contributor(f"o{i}", (i,)) for i in range(4)]
    big = Contributor("big", tuple(range(100, 150)))
    chooser = ProblemChooser(k, seed=3)
    other_rows = torch.randn(4, 4, generator=gen).tolist()
    direction = [3.0, 4.0, 0.0, 12.0]
    with_big = round_prompts([*others, big], chooser)
    rows = other_rows + [direction] * (len(with_big.prompts) - 4)
    assert len(with_big.prompts) == 4 + k
    summed_with = clip_and_sum(sum_within_records(_per_prompt(rows), with_big), clip)
    summed_without = clip_and_sum(_per_prompt(other_rows), clip)
    change = torch.cat([(summed_with[n] - summed_without[n]).flatten() for n in summed_with])
    assert float(change.norm()) == pytest.approx(clip, rel=1e-6)     # <= C, attained
    per_prompt = clip_and_sum(_per_prompt(rows), clip)                # the prompt-level record
    change = torch.cat([(per_prompt[n] - summed_without[n]).flatten() for n in per_prompt])
    assert float(change.norm()) == pytest.approx(k * clip, rel=1e-6)


def test_config_keys_are_validated():
    from dpgrpo.config import apply_overrides, embedded_default

    cfg = apply_overrides(embedded_default(), ["data.privacy_unit=contributor",
                                               "data.contributors=map.csv",
                                               "data.per_contributor=3", "data.n_slots=50"])
    assert (cfg.data.privacy_unit, cfg.data.contributors, cfg.data.per_contributor) == (
        "contributor", "map.csv", 3)
    assert embedded_default().data.privacy_unit == "prompt"
    for bad, message in ((["data.privacy_unit=person"],
                          "privacy_unit must be one of prompt, contributor; got 'person'"),
                         (["data.per_contributor=0"], "per_contributor must be >= 1"),
                         (["data.contributors=map.csv"], "privacy_unit = 'contributor'")):
        with pytest.raises(ConfigError, match=message):
            apply_overrides(embedded_default(), bad)
