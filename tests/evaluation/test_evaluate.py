"""Greedy evaluation end to end on the tiny random model: files, summary, resume, rescoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.evaluation.evaluate import EvalSettings, load_model, run_eval
from dpgrpo.evaluation.predictions import (
    SUMMARY_KEYS,
    Prediction,
    read_predictions,
    rescore,
    score_response,
    summarize,
)
from dpgrpo.tasks import Problem, Verdict, get_task, load_problems


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[object, object]:
    return load_model(str(tiny_model_dir), None, dtype="float32", device="cpu")


def _settings(tiny_model_dir: Path, out: Path, **overrides: object) -> EvalSettings:
    values = dict(task="arithmetic", model=str(tiny_model_dir), out_dir=out, limit=5,
                  batch_size=2, max_new_tokens=12)
    values.update(overrides)
    return EvalSettings(**values)  # type: ignore[arg-type]


def test_eval_writes_contract_files_and_resumes(tiny_model_dir: Path, tiny: tuple,
                                                tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    summary = run_eval(_settings(tiny_model_dir, tmp_path, arm="base", seed=3),
                       loaded=tiny, progress=lambda done, total: calls.append((done, total)))
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    problems = load_problems("arithmetic", "eval")[:5]
    assert [r["id"] for r in records] == [p.id for p in problems]
    task = get_task("arithmetic")
    for doc_id, (record, problem) in enumerate(zip(records, problems)):
        assert set(record) == {"id", "doc_id", "prompt", "target", "response", "n_tokens",
                               "hit_cap", "scores"}
        # lm-eval-like: position in the split, the user message and the (public) gold answer
        assert (record["doc_id"], record["target"]) == (doc_id, problem.answer)
        assert record["prompt"] == task.prompt(problem) and problem.question in record["prompt"]
        assert set(record["scores"]) == {"strict"}
        assert set(record["scores"]["strict"]) == {"extracted", "correct", "timed_out"}
        assert 1 <= record["n_tokens"] <= 12
        if record["hit_cap"]:  # cut at the cap: exactly max_new_tokens tokens
            assert record["n_tokens"] == 12
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == summary and tuple(saved) == SUMMARY_KEYS
    assert (saved["task"], saved["n"], saved["arm"], saved["seed"], saved["max_new_tokens"]) == (
        "arithmetic", 5, "base", 3, 12)
    n_correct = sum(r["scores"]["strict"]["correct"] for r in records)
    assert saved["correct"] == {"strict": n_correct}
    assert saved["accuracy"]["strict"] == pytest.approx(n_correct / 5)
    assert saved["cap_rate"] == pytest.approx(sum(r["hit_cap"] for r in records) / 5)
    assert saved["mean_tokens"] == pytest.approx(sum(r["n_tokens"] for r in records) / 5)
    assert calls[0] == (0, 5) and calls[-1] == (5, 5)

    # The saved verdicts are what the task's scorer says about the saved responses.
    task = get_task("arithmetic")
    for record, problem in zip(records, problems):
        verdict = task.verify(record["response"], problem)
        assert record["scores"]["strict"]["correct"] == verdict.correct

    # Resume: a crash left half a line; a rerun with a larger limit only adds the missing ids.
    with (tmp_path / "predictions.jsonl").open("a") as handle:
        handle.write('{"id": "arith-eval-00005", "resp')
    calls.clear()
    summary = run_eval(_settings(tiny_model_dir, tmp_path, limit=7), loaded=tiny,
                       progress=lambda done, total: calls.append((done, total)))
    after = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert after[:5] == lines and len(after) == 7 and summary["n"] == 7
    assert calls[0] == (5, 7)


def test_eval_refuses_to_mix_runs(tiny_model_dir: Path, tiny: tuple, tmp_path: Path) -> None:
    run_eval(_settings(tiny_model_dir, tmp_path, limit=1), loaded=tiny)
    with pytest.raises(ConfigError, match="another run"):
        run_eval(_settings(tiny_model_dir, tmp_path, limit=1, max_new_tokens=8), loaded=tiny)


def test_eval_greedy_is_deterministic(tiny_model_dir: Path, tiny: tuple, tmp_path: Path) -> None:
    run_eval(_settings(tiny_model_dir, tmp_path / "a", limit=2), loaded=tiny)
    run_eval(_settings(tiny_model_dir, tmp_path / "b", limit=2, batch_size=1), loaded=tiny)
    a = [p.response for p in read_predictions(tmp_path / "a" / "predictions.jsonl")]
    b = [p.response for p in read_predictions(tmp_path / "b" / "predictions.jsonl")]
    assert a == b


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError):
        EvalSettings(task="arithmetic", model="m", out_dir=Path("x"), batch_size=0)
    with pytest.raises(ConfigError):
        EvalSettings(task="arithmetic", model="m", out_dir=Path("x"), limit=0)


def _math_prediction(pid: str, response: str, hit_cap: bool = False) -> tuple[Problem, Prediction]:
    problem = Problem(pid, "q", "\\frac{1}{2}")
    scores = score_response(get_task("math"), problem, response, hit_cap=hit_cap)
    return problem, Prediction(pid, response, 10, hit_cap, scores)


def test_summary_and_rescore_on_math_scorers() -> None:
    pairs = [_math_prediction("a", "\\boxed{0.5}"),
             _math_prediction("b", "So the answer is $1/2$."),
             _math_prediction("c", "So the answer is $1/2$.", hit_cap=True),
             _math_prediction("d", "\\boxed{10^{10^{10}}}")]
    problems, predictions = zip(*pairs)
    summary = summarize(predictions, task="math", model="m", max_new_tokens=10)
    assert summary["correct"] == {"strict": 1, "robust": 2}
    assert summary["accuracy"]["robust"] == pytest.approx(0.5)
    assert summary["cap_rate"] == pytest.approx(0.25) and summary["verifier_timeouts"] == 1
    stripped = [Prediction(p.id, p.response, p.n_tokens, p.hit_cap,
                           {"strict": p.scores["strict"]}) for p in predictions]
    result = rescore(stripped, problems, get_task("math"), "robust")
    assert (result.n, result.correct, result.timeouts, result.changed) == (4, 2, 1, 0)
    assert ([p.scores["robust"] for p in result.predictions]
            == [p.scores["robust"] for p in predictions])
    flipped = [Prediction("a", "\\boxed{0.5}", 1, False, {"strict": Verdict(False, None)})]
    assert rescore(flipped, problems, get_task("math"), "strict").changed == 1
    with pytest.raises(ConfigError, match="no scorer"):
        rescore(stripped, problems, get_task("math"), "final")
    with pytest.raises(DataError, match="not in the"):
        rescore(stripped, problems[:1], get_task("math"), "strict")


def test_read_predictions_rejects_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    good = {"id": "a", "response": "r", "n_tokens": 1, "hit_cap": False,
            "scores": {"strict": {"extracted": None, "correct": False, "timed_out": False}}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "n_tokens": "1"}) + "\n")
    with pytest.raises(DataError) as info:
        read_predictions(path)
    assert (info.value.line, info.value.field) == (2, "n_tokens")
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataError, match="duplicate"):
        read_predictions(path)


def test_eval_skip_invalid_lists_skipped_records(tiny_model_dir: Path, tiny: tuple,
                                                 tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    good = json.dumps({"question": "What is 1+1?", "answer": "1+1=2\n#### 2"})
    (data / "test.jsonl").write_text(good + "\n" + json.dumps({"question": "q"}) + "\n")
    settings = _settings(tiny_model_dir, tmp_path / "out", task="gsm8k",
                         data_dir=tmp_path / "data", limit=None)
    with pytest.raises(DataError, match="line 2, field 'answer'"):
        run_eval(settings, loaded=tiny)
    with caplog.at_level("WARNING"):
        summary = run_eval(EvalSettings(**{**settings.__dict__, "skip_invalid": True}),
                           loaded=tiny)
    assert summary["n"] == 1
    assert any("line 2, field 'answer'" in record.getMessage() for record in caplog.records)
