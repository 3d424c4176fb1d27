"""The Python API (``from dpgrpo import train``): the README example runs as written, custom
problems and rewards become one task, model objects, datasets, public n, custom CLI tasks."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

import dpgrpo
from dpgrpo.errors import ConfigError, DataError
from dpgrpo.tasks import Problem, get_task, make_task
from dpgrpo.tasks import base as task_base

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = ["model.device=cpu", "train.rounds=1", "train.group_size=2", "train.max_new_tokens=4",
        "privacy.expected_batch=2", "privacy.noise_multiplier=1.0"]


def _readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def tiny_lm(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(autouse=True)
def _clean_registries(monkeypatch):
    """Tasks and model objects registered by a test stay in that test."""
    import dpgrpo.model as models

    monkeypatch.setattr(task_base, "_TASKS", dict(task_base._TASKS))
    monkeypatch.setattr(models, "_OBJECTS", dict(models._OBJECTS))


def test_readme_example_runs(tiny_lm, tmp_path, monkeypatch, capsys):
    """The README's code block, unchanged, with the alias served by the tiny model in memory."""
    import dpgrpo.model as models

    models.register_model("smollm2-135m", *tiny_lm)
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_example(), str(README), "exec"), {"__name__": "readme"})
    run = tmp_path / "runs" / "readme-example"
    release, epsilon = capsys.readouterr().out.split()
    assert tmp_path / release == run / "release" and 0 < float(epsilon) <= 8.0
    cert = json.loads((run / "release" / "certificate.json").read_text())
    assert cert["n"] == 100 and cert["n_source"].startswith("data.n_slots")
    assert cert["task"] == "custom" and cert["rounds_charged"] == 4 and cert["releasable"]
    # the alias is named by its public hub id, in the adapter config and the model card
    adapter = json.loads((run / "release" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    card = (run / "release" / "README.md").read_text()
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n")
    assert "library_name: peft" in card and "- dpgrpo" in card and "What each figure" in card
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]


def test_rewards_are_summed_weighted_and_get_the_record():
    seen = []

    def exact(completion, problem):
        seen.append(problem)
        return float(problem["answer"] in completion)

    def length(completion, problem):
        return len(completion) / 10

    rows = [{"question": "2 + 3?", "answer": "5", "extra": "kept"},
            {"prompt": "1 + 1?", "answer": 2}]
    task = make_task(rows, [exact, length], reward_weights=[2.0, -1.0])
    problems = task.load_split("train").problems
    assert [p.id for p in problems] == ["custom-000000", "custom-000001"]
    assert (problems[1].question, problems[1].answer) == ("1 + 1?", "2")
    assert task.reward("it is 5", problems[0]) == pytest.approx(2.0 - 0.7)
    assert seen[-1] is rows[0]  # the user's own record, extra fields included
    assert task.prompt(problems[0]) == "2 + 3?" and task.gold_target(problems[0]) == "5"
    verdict = task.scorers()["strict"]("5", problems[0], hit_cap=False)
    assert verdict.correct and verdict.extracted == "1.9"
    nan = make_task(rows, [exact, lambda c, p: math.nan, lambda c, p: math.inf])
    assert nan.reward("5", problems[0]) == 1.0  # non-finite terms count as 0.0 (fixed rule)


def test_problems_and_datasets_rows_and_bad_records():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"id": "a", "question": "q1", "answer": "1"},
                                     {"id": "b", "question": "q2", "answer": "2"}])
    task = make_task(ds, lambda c, p: 1.0, eval_problems=[Problem("c", "q3", "3")])
    assert [p.id for p in task.load_split("train").problems] == ["a", "b"]
    assert [p.id for p in task.load_split("eval").problems] == ["c"]
    with pytest.raises(DataError, match=r"problems, line 2, field 'id': duplicate id 'a'"):
        make_task([{"id": "a", "question": "x"}, {"id": "a", "question": "y"}], lambda c, p: 0)
    with pytest.raises(DataError, match=r"problems, line 1, field 'question'"):
        make_task([{"answer": "1"}], lambda c, p: 0)
    with pytest.raises(ConfigError, match="at least one reward"):
        make_task([{"question": "x"}], [])


def test_a_private_list_needs_a_public_n(tiny_model_dir, tmp_path):
    rows = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(6)]
    with pytest.raises(ConfigError, match=r"length is private: set data.n_slots"):
        dpgrpo.prepare(model=str(tiny_model_dir), problems=rows, rewards=lambda c, p: 0.0)
    cfg = dpgrpo.prepare(model=str(tiny_model_dir), problems=rows, rewards=lambda c, p: 0.0,
                         n_slots=6, overrides=TINY)
    from dataclasses import replace

    from dpgrpo.training.trainer import train

    with pytest.raises(ConfigError, match="length is private"):  # the trainer refuses it too
        train(replace(cfg, data=replace(cfg.data, n_slots=None)), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    cfg = dpgrpo.prepare(model=str(tiny_model_dir), problems=rows, rewards=lambda c, p: 0.0,
                         overrides={"data.limit": 10})  # a public capacity also fixes n
    assert (cfg.data.task, cfg.data.limit, cfg.model.name) == ("custom", 10, str(tiny_model_dir))


def test_peft_model_object_and_dataset_train(tiny_lm, tmp_path):
    """A PeftModel trains with its own adapter; metrics hold public keys only."""
    datasets = pytest.importorskip("datasets")
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_lm
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                  task_type="CAUSAL_LM"))
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_B" in n}
    ds = datasets.Dataset.from_list([{"question": f"{i} + 2?", "answer": str(i + 2)}
                                     for i in range(8)])
    result = dpgrpo.train(model=peft_model, tokenizer=tokenizer, model_name="tiny/peft",
                          problems=ds, rewards=lambda c, p: float(p["answer"] in c), n_slots=8,
                          overrides=[*TINY, "train.rounds=2", "privacy.expected_batch=8",
                                     "train.metrics=jsonl,tensorboard",
                                     "train.public_timings=true"],
                          out=tmp_path / "run")
    cert = result.certificate
    assert cert["model"] == "tiny/peft" and cert["n"] == 8
    assert cert["trainable_coordinates"] == sum(p.numel() for p in peft_model.parameters()
                                                if p.requires_grad)
    after = {n: p for n, p in peft_model.named_parameters() if "lora_B" in n}
    assert any(not after[n].equal(before[n]) for n in before)  # the given adapter trained
    from dpgrpo.training.metrics import PUBLIC_KEYS, TIMING_KEYS

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(set(r) == PUBLIC_KEYS | TIMING_KEYS for r in rows)  # train.public_timings
    assert all(r["time/rollout"] > 0 and r["time/gradients"] > 0 for r in rows)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == (PUBLIC_KEYS | TIMING_KEYS) - {"round"}
    assert [e.step for e in events.Scalars("epsilon")] == [1, 2]


def test_registry_never_replaces_a_builtin_task():
    custom = make_task([{"question": "x"}], lambda c, p: 0.0, name="arithmetic")
    with pytest.raises(ValueError, match="already registered"):
        task_base.register_task(custom, replace=True)
    first = make_task([{"question": "x"}], lambda c, p: 0.0, name="mine")
    task_base.register_task(first, replace=True)
    second = make_task([{"question": "y"}], lambda c, p: 0.0, name="mine")
    assert task_base.register_task(second, replace=True) is get_task("mine")


TASK_MODULE = '''
import dpgrpo

TASK = dpgrpo.make_task([{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(6)],
                        lambda completion, problem: float(problem["answer"] in completion),
                        name="ignored", eval_problems=[{"id": "e0", "question": "9 + 1?",
                                                        "answer": "10"}])

def factory():
    return TASK

NOT_A_TASK = 3
'''


@pytest.fixture
def task_module(tmp_path, monkeypatch):
    (tmp_path / "my_dpgrpo_tasks.py").write_text(TASK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_dpgrpo_tasks"
    sys.modules.pop("my_dpgrpo_tasks", None)


def test_tasks_load_from_module_attr_and_entry_points(task_module, monkeypatch):
    task = get_task(f"{task_module}:TASK")
    assert task.name == f"{task_module}:TASK" and len(task.load_split("train").problems) == 6
    assert get_task(f"{task_module}:factory").name == f"{task_module}:factory"
    with pytest.raises(ConfigError, match="resolved to a int"):
        get_task(f"{task_module}:NOT_A_TASK")
    with pytest.raises(ConfigError, match="cannot load 'nope'"):
        get_task(f"{task_module}:nope")

    class EntryPoint:
        def load(self):
            return sys.modules[task_module].factory

    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group, name: [EntryPoint()] if name == "plugged" else [])
    assert get_task("plugged").name == "plugged"
    with pytest.raises(ConfigError, match=r"unknown task 'absent'.*entry point"):
        get_task("absent")


def test_cli_trains_and_evaluates_a_custom_task(task_module, tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    run = tmp_path / "run"
    args = ["train", "--task", f"{task_module}:TASK", "--model", str(tiny_model_dir), "-o",
            str(run), "--json", *(x for o in TINY for x in ("--set", o))]
    refused = CliRunner().invoke(app, args)
    assert "length is private" in str(refused.exception) and not run.exists()
    trained = CliRunner().invoke(app, [*args, "--set", "data.n_slots=6"])
    assert trained.exit_code == 0, trained.output
    printed = json.loads(trained.stdout)
    assert printed["release"] == str(run / "release") and printed["rounds"] == 1
    evaluated = CliRunner().invoke(app, ["eval", "--run", str(run), "-o", str(tmp_path / "ev"),
                                         "--max-new-tokens", "3", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    summary = json.loads(evaluated.stdout)
    assert summary["task"] == f"{task_module}:TASK" and summary["n"] == 1
    row = json.loads((tmp_path / "ev" / "predictions.jsonl").read_text())
    assert (row["id"], row["doc_id"], row["prompt"], row["target"]) == ("e0", 0, "9 + 1?", "10")
    again = dpgrpo.evaluate(run, out=tmp_path / "ev2", max_new_tokens=3)  # the Python API
    assert {k: again[k] for k in ("task", "model", "arm", "n")} == {
        k: summary[k] for k in ("task", "model", "arm", "n")}
    assert again["adapter"] == str(run / "release")


def test_a_trl_script_ports_in_one_line(tiny_lm, tmp_path):
    """A TRL-shaped dataset (conversational prompts, extra columns), a TRL reward function and
    TRL's option names train through dpgrpo.train(**dpgrpo.from_trl_config(...))."""
    datasets = pytest.importorskip("datasets")
    model, tokenizer = tiny_lm
    ds = datasets.Dataset.from_list([
        {"prompt": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"{i} + 1?"}], "solution": str(i + 1)}
        for i in range(6)])
    groups = []

    def accuracy(prompts, completions, solution, **kwargs):
        groups.append((len(completions), len(set(map(str, prompts))), len(set(solution))))
        return [float(s in c[0]["content"]) for c, s in zip(completions, solution)]

    trl_args = {"num_generations": 2, "max_completion_length": 4, "loss_type": "dr_grpo",
                "scale_rewards": False, "beta": 0.0, "max_steps": 1,
                "per_device_train_batch_size": 4, "mask_truncated_completions": True}
    result = dpgrpo.train(model=model, tokenizer=tokenizer, model_name="tiny/trl", problems=ds,
                          rewards=accuracy, n_slots=6, out=tmp_path / "run",
                          **dpgrpo.from_trl_config(trl_args, overrides={
                              "model.device": "cpu", "privacy.noise_multiplier": 1.0}))
    cert = result.certificate
    assert cert["rounds_charged"] == 1 and cert["n"] == 6 and cert["q"] == 2 / 6
    config = json.loads((tmp_path / "run" / "release" / "dpgrpo_config.json").read_text())
    assert (config["train"]["loss_type"], config["train"]["scale_rewards"]) == ("dr_grpo", "none")
    assert all(g == (2, 1, 1) for g in groups)          # one prompt's 2 completions per call
