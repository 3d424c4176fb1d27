"""Loaders: real rows from the shared data folder, the paper's splits, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.tasks import get_task, load_problems, load_split, split_summary
from dpgrpo.tasks.records import normalize_text


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.mark.parametrize("task, split", [("gsm8k", "train"), ("gsm8k", "eval"),
                                         ("csqa", "eval"), ("svamp", "eval"),
                                         ("math", "test"), ("math", "eval")])
def test_real_rows_load_and_their_gold_targets_verify(shared_data_dir: Path, task: str,
                                                      split: str) -> None:
    spec = get_task(task)
    problems = load_problems(task, split, shared_data_dir)
    assert problems and len({p.id for p in problems}) == len(problems)
    for problem in problems[:: max(1, len(problems) // 15)]:  # a spread-out sample
        assert problem.question.strip() and problem.answer.strip()
        assert spec.verify(spec.gold_target(problem), problem).correct, problem.id


def test_gsm8k_record_fields(shared_data_dir: Path) -> None:
    first = _jsonl(shared_data_dir / "gsm8k" / "test.jsonl")[0]
    problem = load_problems("gsm8k", "eval", shared_data_dir)[0]
    assert problem.id == "gsm8k-test-00000"
    assert problem.question == first["question"] and problem.solution == first["answer"]
    assert problem.answer == first["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    assert "<<" not in get_task("gsm8k").gold_target(problem)


def test_csqa_and_svamp_record_fields(shared_data_dir: Path) -> None:
    raw = _jsonl(shared_data_dir / "csqa" / "dev_rand_split.jsonl")[0]
    problem = load_problems("csqa", "eval", shared_data_dir)[0]
    assert problem.id == raw["id"] and problem.answer == raw["answerKey"]
    assert problem.choices == tuple(zip(raw["choices"]["label"], raw["choices"]["text"]))
    svamp = load_problems("svamp", "eval", shared_data_dir)
    raw_svamp = json.loads((shared_data_dir / "svamp" / "SVAMP.json").read_text())
    assert len(svamp) == len(raw_svamp)
    assert svamp[0].id == raw_svamp[0]["ID"]
    assert float(svamp[0].answer) == float(raw_svamp[0]["Answer"])
    assert svamp[0].question.startswith(raw_svamp[0]["Body"].strip())


def test_math_eval_split_is_test_minus_math500_minus_train_duplicates(
        shared_data_dir: Path) -> None:
    folder = shared_data_dir / "math"
    test = [normalize_text(r["problem"]) for r in _jsonl(folder / "test.jsonl")]
    math500 = {normalize_text(r["question"]) for r in _jsonl(folder / "math500_test.jsonl")}
    train = {normalize_text(r["problem"]) for r in _jsonl(folder / "train.jsonl")}
    expected = [t for t in test if t not in math500 and t not in train]
    loaded = load_split("math", "eval", shared_data_dir)
    assert [normalize_text(p.question) for p in loaded.problems] == expected
    assert loaded.excluded == {"excluded_math500": sum(t in math500 for t in test),
                               "excluded_duplicates": sum(t in train and t not in math500
                                                          for t in test)}
    if len(test) == 5000:  # the full benchmark, as in the paper (Appendix C-C)
        assert len(loaded.problems) == 4499
        assert loaded.excluded == {"excluded_math500": 500, "excluded_duplicates": 1}


def test_data_dir_may_be_the_benchmark_folder_itself(shared_data_dir: Path) -> None:
    a = load_problems("gsm8k", "eval", shared_data_dir)
    b = load_problems("gsm8k", "eval", shared_data_dir / "gsm8k")
    assert a == b


def test_file_tasks_need_a_data_dir_and_know_their_splits() -> None:
    with pytest.raises(ConfigError, match="data directory"):
        load_problems("gsm8k", "eval")
    with pytest.raises(ConfigError, match="no split"):
        load_problems("svamp", "train", "/nonexistent")
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("imagenet")


def _write(root: Path, folder: str, name: str, lines: list[bytes]) -> Path:
    (root / folder).mkdir(parents=True, exist_ok=True)
    path = root / folder / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


GOOD_GSM8K = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}).encode()


@pytest.mark.parametrize("bad, field, message", [
    (json.dumps({"answer": "#### 2"}).encode(), "question", "missing field"),
    (json.dumps({"question": "q", "answer": "no final line"}).encode(), "answer", "####"),
    (json.dumps({"question": "q", "answer": "work\n####  "}).encode(), "answer", "empty"),
    (json.dumps({"question": "q", "answer": "#### two"}).encode(), "answer", "not a number"),
    (json.dumps({"question": "   ", "answer": "#### 2"}).encode(), "question", "empty"),
    (json.dumps({"question": 7, "answer": "#### 2"}).encode(), "question", "expected a string"),
    (b'{"question": "caf\xe9", "answer": "#### 2"}', None, "undecodable"),
    (b'{"question": ', None, "invalid JSON"),
    (json.dumps({"question": "x" * (1 << 20), "answer": "#### 2"}).encode(), None,
     "over the 1,048,576-byte bound"),  # issue 33: a 64 MB line was accepted
])
def test_bad_gsm8k_records_fail_with_file_line_field(tmp_path: Path, bad: bytes,
                                                     field: str | None, message: str) -> None:
    path = _write(tmp_path, "gsm8k", "test.jsonl", [GOOD_GSM8K, bad, GOOD_GSM8K])
    with pytest.raises(DataError, match=message) as info:
        load_problems("gsm8k", "eval", tmp_path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, field)
    loaded = load_split("gsm8k", "eval", tmp_path, skip_invalid=True)
    assert [p.id for p in loaded.problems] == ["gsm8k-test-00000", "gsm8k-test-00002"]
    assert [(e.line, e.field) for e in loaded.skipped] == [(2, field)]


def test_bad_math_and_csqa_references(tmp_path: Path) -> None:
    _write(tmp_path, "math", "test.jsonl", [
        json.dumps({"problem": "p", "solution": "so \\boxed{}"}).encode()])
    with pytest.raises(DataError, match="empty answer") as info:
        load_problems("math", "test", tmp_path)
    assert info.value.field == "solution"
    record = {"id": "x", "question": "q", "answerKey": "F",
              "choices": {"label": ["A", "B"], "text": ["a", "b"]}}
    _write(tmp_path, "csqa", "dev_rand_split.jsonl", [json.dumps(record).encode()])
    with pytest.raises(DataError, match="not one of the option labels"):
        load_problems("csqa", "eval", tmp_path)


def test_duplicate_ids_are_errors(tmp_path: Path) -> None:
    record = {"id": "dup", "question": "q", "answerKey": "A",
              "choices": {"label": ["A", "B"], "text": ["a", "b"]}}
    line = json.dumps(record).encode()
    _write(tmp_path, "csqa", "dev_rand_split.jsonl", [line, line])
    with pytest.raises(DataError, match="duplicate id") as info:
        load_problems("csqa", "eval", tmp_path)
    assert (info.value.line, info.value.field) == (2, "id")
    assert len(load_split("csqa", "eval", tmp_path, skip_invalid=True).skipped) == 1


def test_svamp_json_array_errors_carry_the_record_line(tmp_path: Path) -> None:
    records = [{"ID": "a", "Body": "b", "Question": "q", "Answer": 3.0},
               {"ID": "b", "Body": "b", "Question": "q", "Answer": "lots"}]
    (tmp_path / "svamp").mkdir()
    (tmp_path / "svamp" / "SVAMP.json").write_text(json.dumps(records, indent=2))
    with pytest.raises(DataError, match="not a number") as info:
        load_problems("svamp", "eval", tmp_path)
    assert info.value.line == 8 and info.value.field == "Answer"


def test_record_bound_counts_the_line_ending_and_keeps_line_numbers(
        tmp_path: Path) -> None:
    from dpgrpo.tasks.records import read_json_array, read_jsonl

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'"' + b"a" * 8 + b'"\r\n' + b'"' + b"b" * 8 + b'"\n\n"c"')
    rows = list(read_jsonl(path, max_bytes=12))  # line 1: 12 bytes, line 2: 11, line 4: 3
    assert [line for line, _ in rows] == [1, 2, 4] and rows[1] == (2, "b" * 8)
    rows = list(read_jsonl(path, max_bytes=11))  # line 1 is now one byte over
    assert isinstance(rows[0][1], DataError) and rows[0][1].line == 1
    assert rows[1:] == [(2, "b" * 8), (4, "c")]
    first, *_ = (r for _, r in read_jsonl(path))  # no bound: read as before
    assert first == "a" * 8
    array = tmp_path / "a.json"
    array.write_text('[\n"' + "a" * 8 + '",\n"' + "b" * 9 + '"\n]')
    rows = list(read_json_array(array, max_bytes=10))
    assert rows[0] == (2, "a" * 8) and isinstance(rows[1][1], DataError) and rows[1][0] == 3


def test_summary_reports_sizes_skips_and_errors(tmp_path: Path) -> None:
    _write(tmp_path, "gsm8k", "train.jsonl", [GOOD_GSM8K, b"{}"])
    _write(tmp_path, "gsm8k", "test.jsonl", [GOOD_GSM8K])
    summary = split_summary("gsm8k", tmp_path)
    assert summary["train"] is None and summary["eval"] == 1
    assert "line 2" in summary["errors"]["train"]
    skipping = split_summary("gsm8k", tmp_path, skip_invalid=True)
    assert skipping["train"] == 1 and len(skipping["skipped"]) == 1 and "errors" not in skipping
