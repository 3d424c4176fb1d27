"""bench/records: the committed run records that bench/README.md's learning claims rest on.

Each finished run of ``bench/vs_trl.py --runs`` keeps its ``record.json``; the ones committed
under ``bench/records/vs-trl/runs`` let a campaign go on in a later sitting and let every
figure be recomputed. A record that does not parse, names an unknown variant, disagrees with
its own per-problem scores or holds a path of the machine that ran it would make the report
wrong without a word, so each is checked here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import vs_trl_runs  # noqa: E402

RECORDS = ROOT / "bench" / "records" / "vs-trl"
PATHS = sorted((RECORDS / "runs").glob("*/*/record.json"))
#: an absolute POSIX path or a Windows drive path inside a JSON string
ABSOLUTE = re.compile(r'"(/(home|work|tmp|root|Users|mnt|var)/|[A-Za-z]:\\\\)')


def check(path: Path) -> list[str]:
    """What is wrong with one record (empty: nothing)."""
    text = path.read_text(encoding="utf-8")
    problems = []
    if ABSOLUTE.search(text):
        problems.append("holds an absolute path")
    record = json.loads(text)
    if record.get("variant") != path.parent.parent.name:
        problems.append(f"variant {record.get('variant')!r} in the folder of "
                        f"{path.parent.parent.name!r}")
    if record.get("variant") not in vs_trl_runs.VARIANTS:
        problems.append(f"unknown variant {record.get('variant')!r}")
    correct, ids = record.get("correct", []), record.get("ids", [])
    if len(correct) != 200 or len(ids) != len(correct) or len(set(ids)) != len(ids):
        problems.append(f"{len(correct)} scores for {len(set(ids))} distinct problems, not 200")
    elif abs(sum(correct) / len(correct) - record.get("accuracy", -1)) > 1e-9:
        problems.append(f"accuracy {record.get('accuracy')} is not the mean of its scores")
    if not re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", str(record.get("commit"))):
        problems.append(f"code version {record.get('commit')!r}")
    elif str(record["commit"]).endswith("+dirty"):
        problems.append("ran uncommitted code (+dirty)")
    return problems


@pytest.mark.parametrize("path", PATHS, ids=[str(p.relative_to(RECORDS)) for p in PATHS])
def test_every_committed_record_is_whole(path):
    assert check(path) == []


def test_the_check_can_fail(tmp_path):
    good = {"variant": "trl", "commit": "0123456789ab", "accuracy": 0.5,
            "ids": [f"p{i}" for i in range(200)], "correct": [i % 2 == 0 for i in range(200)]}
    folder = tmp_path / "runs" / "trl" / "r1"
    folder.mkdir(parents=True)
    path = folder / "record.json"
    path.write_text(json.dumps(good))
    assert check(path) == []
    for change, expected in [({"accuracy": 0.6}, "not the mean"),
                             ({"variant": "dpgrpo"}, "in the folder of"),
                             ({"commit": "0123456789ab+dirty"}, "uncommitted"),
                             ({"correct": good["correct"][:100]}, "not 200"),
                             ({"model": "/work/exp/smollm2-135m-hf"}, "absolute path")]:
        path.write_text(json.dumps({**good, **change}))
        assert any(expected in p for p in check(path)), change


def test_the_report_reads_the_committed_records():
    if not PATHS:
        pytest.skip("no committed records yet")
    summary = vs_trl_runs.report(vs_trl_runs.records(RECORDS), any_commit=True)
    runs = sum(v["runs"] for v in summary["variants"].values())
    assert runs == len(PATHS)
