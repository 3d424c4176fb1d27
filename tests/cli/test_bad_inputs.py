"""Bad inputs a new user tries (issue 33): each ends with exit status 2 and ONE ``error:`` line
naming the file, row or key, never a traceback or a silent run; where no round started,
nothing is charged and no run directory is left behind.

The commands run in-process through :func:`dpgrpo.cli.main` (the same entry point as the
console script), so no interpreter start-up per case.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dpgrpo.cli import main

TINY = ["--set", "model.device=cpu", "--set", "train.rounds=1", "--set", "train.group_size=2",
        "--set", "train.max_new_tokens=2", "--set", "privacy.expected_batch=2",
        "--set", "privacy.noise_multiplier=1.0"]


def _toml(tmp: Path, text: str) -> str:
    """A TOML file of its own per case (the table is built at once: a shared name would leave
    every case reading the last one written)."""
    path = tmp / f"bad-{len(list(tmp.glob('bad-*.toml')))}.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _module(tmp: Path, name: str, body: str) -> str:
    (tmp / f"{name}.py").write_text(textwrap.dedent(body))
    return name


_TASK_OK = """
    import dpgrpo
    PROBLEMS = [{"id": str(i), "question": f"{i}+1?", "answer": str(i + 1)} for i in range(4)]
"""


def _cases(tmp: Path, model: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (argv, what the error line must name). ``model`` is the tiny model folder."""
    gsm = tmp / "data" / "gsm8k"
    gsm.mkdir(parents=True)
    (gsm / "train.jsonl").write_text("".join(json.dumps({"question": "q", "answer": "no final"})
                                             + "\n" for _ in range(3)))
    big = tmp / "big" / "gsm8k"
    big.mkdir(parents=True)
    (big / "train.jsonl").write_text(
        json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
        + json.dumps({"question": "x" * (1 << 20), "answer": "#### 2"}) + "\n")
    run = ["train", "--out", str(tmp / "run"), "--model", str(model), *TINY]
    syntax = _module(tmp, "bad_syntax_task", "def oops(:\n")
    raising = _module(tmp, "raising_task", "raise RuntimeError('boom at import')\n")
    factory = _module(tmp, "factory_task", "def TASK():\n    raise KeyError('no such table')\n")
    latin = tmp / "latin1.toml"
    latin.write_bytes('[model]\nname = "caf\xe9"\n'.encode("latin-1"))
    return {
        "rounds = true": (["train", _toml(tmp, "[train]\nrounds = true\n")], "train.rounds"),
        "epsilon = true": (["train", _toml(tmp, "[privacy]\nepsilon = true\n")], "privacy.epsilon"),
        "rounds = 2.0": (["train", _toml(tmp, "[train]\nrounds = 2.0\n")], "train.rounds"),
        'epsilon = "8"': (["train", _toml(tmp, '[privacy]\nepsilon = "8"\n')], "privacy.epsilon"),
        "model.name = 1": (["train", _toml(tmp, "[model]\nname = 1\n")], "model.name"),
        "learning_rate = inf": (["train", _toml(tmp, "[train]\nlearning_rate = inf\n")],
                                "train.learning_rate"),
        "beta = inf": (["train", _toml(tmp, "[train]\nbeta = inf\n")], "train.beta"),
        "temperature = inf": (["train", _toml(tmp, "[train]\ntemperature = inf\n")],
                              "train.temperature"),
        "max_new_tokens = 0": ([*run, "--set", "train.max_new_tokens=0"], "train.max_new_tokens"),
        "every record invalid": ([*run, "--set", "data.task=gsm8k", "--set",
                                  f"data.data_dir={tmp / 'data'}", "--set",
                                  "data.skip_invalid=true"], "train.jsonl"),
        "a record over 1 MiB": ([*run, "--set", "data.task=gsm8k", "--set",
                                 f"data.data_dir={tmp / 'big'}", "--set", "data.n_slots=4"],
                                "train.jsonl, line 2"),
        "task syntax error": ([*run, "--task", f"{syntax}:TASK"], syntax),
        "task raises on import": ([*run, "--task", f"{raising}:TASK"], raising),
        "task factory raises": ([*run, "--task", f"{factory}:TASK"], f"{factory}:TASK()"),
        "device cuda without CUDA": ([*run, "--set", "model.device=cuda:7"], "model.device"),
        "bogus device": ([*run, "--set", "model.device=gpu-please"], "model.device"),
        "tiny sigma": ([*run, "--set", "privacy.noise_multiplier=1e-9"],
                       "privacy.noise_multiplier"),
        "negative seed": ([*run, "--seed", "-1"], "privacy.seed"),
        "negative canaries": ([*run, "--set", "audit.canaries=-1"], "audit.canaries"),
        "TOML not UTF-8": (["train", str(latin)], str(latin)),
        "privacy epsilon sigma 1e-3": (["privacy", "epsilon", "--n", "1000", "--expected-batch",
                                        "10", "--rounds", "50", "--sigma", "1e-3"], "--sigma"),
        "privacy epsilon sigma 0.01": (["privacy", "epsilon", "--n", "1000", "--expected-batch",
                                        "10", "--rounds", "50", "--sigma", "0.01"], "--sigma"),
        "offline hub id": (["train", "--out", str(tmp / "run"), "--model",
                            "no-such-org/no-such-model", *TINY], "no-such-org/no-such-model"),
        # train.steps was renamed: refused with the new name, never read as an alias
        "old key in a TOML": (["train", _toml(tmp, "[train]\nsteps = 3\n")],
                              "train.steps was renamed train.rounds"),
        "old key in --set": (["train", "--set", "train.steps=3"],
                             "train.steps was renamed train.rounds"),
    }


CASES = ["rounds = true", "epsilon = true", "rounds = 2.0", 'epsilon = "8"', "model.name = 1",
         "learning_rate = inf", "beta = inf", "temperature = inf", "max_new_tokens = 0",
         "every record invalid", "a record over 1 MiB", "task syntax error",
         "task raises on import",
         "task factory raises", "device cuda without CUDA", "bogus device", "tiny sigma",
         "negative seed", "negative canaries", "TOML not UTF-8", "privacy epsilon sigma 1e-3",
         "privacy epsilon sigma 0.01", "offline hub id", "old key in a TOML", "old key in --set"]


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    return info.value.code, [line for line in err.splitlines() if line.strip()]


def _assert_one_error_line(code: int, lines: list[str], needle: str) -> None:
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 2, lines
    assert len(errors) == 1 and needle in errors[0], lines
    assert not any("Traceback" in line for line in lines), lines


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_error_line_and_leaves_nothing(case, tmp_path, tiny_model_dir,
                                                        monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    argv, needle = _cases(tmp_path, tiny_model_dir)[case]
    code, lines = _run(argv, capsys)
    _assert_one_error_line(code, lines, needle)
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()  # nothing charged


def _release(tmp_path: Path) -> Path:
    release = tmp_path / "release"
    release.mkdir()
    (release / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    (release / "adapter_config.json").write_text("{}")
    return release


@pytest.mark.parametrize("damage", [
    b"\xff\xfe not utf-8",                 # bytes, not text
    b'{"epsilon": 1.0, "releasable": tr',  # truncated JSON
    b"[1, 2, 3]",                          # JSON, but not a certificate
])
def test_push_with_a_damaged_certificate_names_it(damage, tmp_path, capsys):
    release = _release(tmp_path)
    (release / "certificate.json").write_bytes(damage)
    code, lines = _run(["push", str(release), "--repo-id", "user/x"], capsys)
    _assert_one_error_line(code, lines, "certificate.json")


def test_push_refuses_a_release_file_that_differs_from_its_checksum(tmp_path, capsys):
    from dpgrpo.rundir.atomic import sha256_file

    release = _release(tmp_path)
    digest = sha256_file(release / "adapter_model.safetensors")
    (release / "certificate.json").write_text(json.dumps(
        {"epsilon": 1.0, "releasable": True,
         "files_sha256": {"adapter_model.safetensors": digest}}))
    (release / "adapter_model.safetensors").write_bytes(b"\1" * 16)  # a flipped file
    code, lines = _run(["push", str(release), "--repo-id", "user/x"], capsys)
    _assert_one_error_line(code, lines, "adapter_model.safetensors")


def test_a_raising_reward_names_the_function_and_round_and_the_run_resumes(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The round had started (it is charged), so the run stays, and resumes once fixed."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    name = _module(tmp_path, "reward_task_33", textwrap.dedent(_TASK_OK) + textwrap.dedent("""
        import os
        def picky(completion, record):
            if os.environ.get("PICKY_OK") != "1":
                raise ZeroDivisionError("reward bug")
            return 1.0
        TASK = dpgrpo.make_task(PROBLEMS, picky, max_new_tokens=2)
    """))
    # q = 4 / 4: every slot is sampled, so the reward runs (at TINY's q = 1/2 an empty
    # sample skipped it now and then, and CI saw the run finish without an error)
    argv = ["train", "--out", str(tmp_path / "run"), "--model", str(tiny_model_dir), *TINY,
            "--task", f"{name}:TASK", "--set", "data.n_slots=4",
            "--set", "privacy.expected_batch=4"]
    code, lines = _run(argv, capsys)
    _assert_one_error_line(code, lines, f"{name}.picky")
    assert "round 1" in next(x for x in lines if x.startswith("error:"))
    assert (tmp_path / "run" / "recovery" / "journal.jsonl").stat().st_size > 0  # charged
    monkeypatch.setenv("PICKY_OK", "1")
    from dpgrpo.training.trainer import train

    result = train(None, tmp_path / "run", resume=True)
    assert result.rounds_done == 1 and result.certificate["rounds_charged"] >= 1


@pytest.mark.parametrize("code, needle", [(28, "disk full"), (30, "read-only file system")])
def test_an_unguarded_full_or_read_only_disk_is_one_error_line(code, needle, tmp_path,
                                                                monkeypatch, capsys):
    """The CLI's last net: ENOSPC/EROFS from a write no guard wraps is still one line."""
    import os

    import dpgrpo.privacy.accounting as accounting

    def failing(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "somewhere"))

    monkeypatch.setattr(accounting, "epsilon_report", failing)
    argv = ["privacy", "epsilon", "--n", "1000", "--expected-batch", "10", "--rounds", "5",
            "--sigma", "1.0"]
    code_, lines = _run(argv, capsys)
    _assert_one_error_line(code_, lines, needle)
    assert str(tmp_path / "somewhere") in lines[0]


def test_other_os_errors_are_not_disguised_as_a_full_disk(monkeypatch):
    import dpgrpo.privacy.accounting as accounting

    def failing(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(accounting, "epsilon_report", failing)
    with pytest.raises(OSError, match="Input/output"):
        main(["privacy", "epsilon", "--n", "1000", "--expected-batch", "10", "--rounds", "5",
              "--sigma", "1.0"])
