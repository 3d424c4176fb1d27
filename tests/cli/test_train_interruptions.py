"""`dpgrpo train` when things go wrong: Ctrl-C, a second writer, bad inputs, failed starts."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpgrpo.cli import app, main
from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faultkit import run_in_child


def tiny_args(model_dir, run_dir, *extra: str) -> list[str]:
    sets = [f"model.name={model_dir}", "model.device=cpu", "data.limit=40",
            "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.group_size=2",
            "train.max_new_tokens=4", "train.checkpoint_every=1"]
    return ["train", *[x for s in sets for x in ("--set", s)], "-o", str(run_dir), "--quiet",
            *extra]


def test_ctrl_c_exits_130_and_says_how_to_resume(tiny_model_dir, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "stderr.txt"
    journal = run_dir / "recovery" / "journal.jsonl"

    def child():
        sys.stderr = open(log, "w", buffering=1)  # noqa: SIM115 - the child exits right after
        # a shell starts background jobs with SIGINT ignored, and Python then never raises
        # KeyboardInterrupt: give the child the handler a terminal's Ctrl-C would meet
        signal.signal(signal.SIGINT, signal.default_int_handler)
        main(tiny_args(tiny_model_dir, run_dir, "--rounds", "500"))

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child()
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.read_bytes().count(b"\n") >= 2):
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.05)
    os.kill(pid, signal.SIGINT)  # what Ctrl-C sends
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130
    message = log.read_text()
    assert "interrupted: every round started so far is charged" in message
    assert f"dpgrpo train --resume {run_dir}" in message and "Traceback" not in message
    assert not (run_dir / ".lock").exists()


def test_second_writer_gets_one_line_naming_the_pid(tiny_model_dir, tmp_path, capsys):
    from dpgrpo.rundir.lock import RunLock

    run_dir = tmp_path / "run"
    with RunLock(run_dir), pytest.raises(SystemExit) as exit_:
        main(tiny_args(tiny_model_dir, run_dir, "--rounds", "1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[0].startswith("run directory: ") and len(err) == 2
    assert err[1].startswith("error: ") and f"pid {os.getpid()}" in err[1]


@pytest.mark.parametrize("arm", ["dp-grpo", "zero-advantage", "shuffled-reward",
                                 "positive-only", "non-private"])
def test_group_size_one_is_refused_for_grpo_arms(arm):
    extra = ["privacy.noise_multiplier=none"] if arm == "non-private" else []
    with pytest.raises(ConfigError, match="every advantage is zero"):
        apply_overrides(embedded_default(), [*extra, "train.group_size=1", f"train.arm={arm}"])


@pytest.mark.parametrize("arm", ["filtered-sft", "gold-sft"])
def test_group_size_one_is_allowed_for_sft_arms(arm):
    cfg = apply_overrides(embedded_default(), ["train.group_size=1", f"train.arm={arm}"])
    assert cfg.train.group_size == 1


def test_empty_train_file_is_named(tmp_path, shared_data_dir):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("")
    (data / "test.jsonl").write_bytes((shared_data_dir / "gsm8k" / "test.jsonl").read_bytes())
    summary = CliRunner().invoke(app, ["data", "summary", "--task", "gsm8k", "--data-dir",
                                       str(tmp_path / "data")])
    assert summary.exit_code == 1
    assert f"{data / 'train.jsonl'}: holds no records" in summary.stderr
    run_dir = tmp_path / "runs" / "x"
    trained = CliRunner().invoke(app, ["train", "--task", "gsm8k", "--data-dir",
                                       str(tmp_path / "data"), "-o", str(run_dir), "--quiet"])
    assert trained.exit_code != 0
    assert f"{data / 'train.jsonl'}: holds no records" in str(trained.exception)
    assert not (tmp_path / "runs").exists()  # the failed start left nothing behind


def test_failed_start_leaves_no_directory(tiny_model_dir, tmp_path):
    from dpgrpo.training.trainer import train

    cfg = apply_overrides(embedded_default(), [
        f"model.name={tiny_model_dir}", "model.device=cpu", "data.limit=40",
        "privacy.expected_batch=4", "privacy.epsilon=1e-9", "privacy.delta=1e-10",
        "train.group_size=2"])  # at delta 1/(10 n) = 0.0025, sigma 113 reaches eps 0: TV <= delta
    with pytest.raises(ConfigError, match="unreachable"):
        train(cfg, tmp_path / "a" / "b" / "run")
    assert not (tmp_path / "a").exists()
    existing = tmp_path / "mine"
    existing.mkdir()
    with pytest.raises(ConfigError, match="unreachable"):
        train(cfg, existing)
    assert existing.is_dir() and list(existing.iterdir()) == []  # the user's folder stays


def test_child_helper_reports_exit_codes():
    assert run_in_child(lambda: None) == 0
    assert run_in_child(lambda: sys.exit(7)) == 7
