"""Issue 57: signs of life without a terminal, one-line errors, honest help and output text."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dpgrpo.cli import app, main
from dpgrpo.cli._progress import CountLines, RoundLines, duration, round_line

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_terminal(monkeypatch):
    """A pipe, as under nohup or CI: no variable that makes rich pretend a terminal."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))


# --- 1. progress --------------------------------------------------------------------------

def test_train_without_a_terminal_prints_loading_and_a_line_per_round(tiny_model_dir, tmp_path,
                                                                      no_terminal):
    sets = [f"model.name={tiny_model_dir}", "model.device=cpu", "data.limit=40",
            "privacy.expected_batch=4", "train.group_size=2",
            "train.max_new_tokens=4", "train.rounds=2", "train.public_timings=true"]
    args = ["train", *[x for s in sets for x in ("--set", s)], "-o", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    err = result.stderr
    phases = [line for line in err.splitlines() if line.endswith(" ...")]
    assert [p.split(" ")[0] for p in phases] == ["reading", "calibrating", "loading"]  # in order
    assert phases[1] == "calibrating sigma to epsilon 8 ..." and str(tiny_model_dir) in phases[2]
    assert err.index(phases[2]) < err.index("round 1/2")   # each phase named before round 1
    lines = [line for line in err.splitlines() if line.startswith("round ")]
    assert [line.split(",")[0] for line in lines] == ["round 1/2", "round 2/2"]
    assert all("epsilon spent <= " in line and "elapsed " in line for line in lines)
    assert "ETA " in lines[0] and "writing release/" in err
    assert "batch" not in err and "reward" not in err          # private values (invariant 6)
    assert "release:" in result.stdout


def test_round_lines_hide_times_unless_allowed_and_private_values_unless_given():
    info = {"round": 3, "rounds": 10, "epsilon": 0.4123, "elapsed": 125.0}
    plain = round_line(info, first_round=1, timings=False)
    assert plain == "round 3/10, epsilon spent <= 0.4123"        # round times reveal batches
    timed = round_line(info, first_round=1, timings=True)
    assert "elapsed 2m05s" in timed and "ETA 4m52s" in timed     # 125 s / 3 rounds x 7 left
    resumed = round_line(info, first_round=3, timings=True)      # one round run here
    assert "ETA 14m35s" in resumed
    private = round_line(info | {"batch_size": 7, "reward_mean": 0.5}, first_round=1,
                         timings=False)
    assert "batch 7 (private)" in private and "reward 0.50 (private)" in private
    seen: list[str] = []
    lines = RoundLines(timings=False, write=seen.append)
    lines(info)
    lines(info | {"round": 4})
    assert seen == ["round 3/10, epsilon spent <= 0.4123", "round 4/10, epsilon spent <= 0.4123"]
    assert (duration(42), duration(303), duration(7620)) == ("42s", "5m03s", "2h07m")


def test_count_lines_print_each_tenth_and_the_last():
    seen: list[str] = []
    count = CountLines("eval gsm8k", write=seen.append)
    for done in range(0, 101, 5):
        count(done, 100)
    assert [line.split(",")[0] for line in seen] == [
        f"eval gsm8k: {d}/100" for d in range(0, 101, 10)]
    assert "ETA" in seen[1] and "ETA" not in seen[-1]


def test_privacy_plan_prints_a_line_per_batch_and_marks_the_recommended_row(monkeypatch):
    import dpgrpo.privacy.calibration as calibration

    monkeypatch.setattr(calibration, "planning_sigma", lambda n, m, rounds, eps, delta: 0.4)
    result = CliRunner().invoke(app, ["privacy", "plan", "--n", "1000", "--epsilon", "8",
                                      "--budget", "576", "--params", "6912", "--m", "8,16,144",
                                      "--G", "4"])
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("plan: m ")]
    assert [line.split(" (")[0] for line in progress] == ["plan: m 8", "plan: m 16", "plan: m 144"]
    rows = [line for line in result.stdout.splitlines() if re.search(r"│\s+\d+\s+│", line)]
    marked = [line for line in rows if line.split("│")[1].strip() == "*"]
    assert len(rows) == 3 and len(marked) == 1
    # T min(1, 1/r): m 144 gives 1 step, m 16 and m 8 about 4.3 each (a tie: the lower r wins)
    assert re.search(r"│\s+16\s+│\s+4\s+│\s+9\s+│", marked[0])
    assert "Recommended (*): m 16, G 4, T 9" in result.stdout
    assert "the first row is a single round" in result.stdout
    data = json.loads(CliRunner().invoke(app, ["privacy", "plan", "--n", "1000", "--epsilon",
                                               "8", "--budget", "576", "--params", "6912",
                                               "--m", "8,16,144", "--G", "4", "--json"]).stdout)
    best = data["rows"][data["recommended"]["row"]]
    assert (best["m"], best["T"]) == (16, 9) and "1/r" in data["recommended"]["rule"]


def test_privacy_report_prints_a_line_per_config(tmp_path):
    paths = []
    for name, sigma in (("a", 0.9), ("b", 1.1)):
        path = tmp_path / f"{name}.toml"
        path.write_text('[data]\ntask = "arithmetic"\nn_slots = 2000\n[privacy]\n'
                        f"noise_multiplier = {sigma}\nexpected_batch = 8\n[train]\nrounds = 3\n")
        paths.append(str(path))
    result = CliRunner().invoke(app, ["privacy", "report", *paths, "-o", str(tmp_path / "b.md")])
    assert result.exit_code == 0, result.output
    done = [line for line in result.stderr.splitlines() if line.startswith("report: ")]
    assert len(done) == 4 and "(1/2)" in done[0] and "(2/2)" in done[2]
    assert done[1].startswith("report: a: n 2,000, m 8, T 3, sigma 0.9000, epsilon ")
    assert "| a |" in result.stdout and "| b |" in result.stdout


# --- 2. push without a network --------------------------------------------------------------

class _ConnectError(Exception):
    """Stands for httpx2.ConnectError: judged by the module it comes from."""


_ConnectError.__module__ = "httpx2"


@pytest.mark.parametrize("error, words", [
    (ConnectionError("[Errno 101] Network is unreachable"), "cannot reach the Hugging Face hub"),
    (_ConnectError("[Errno -3] Temporary failure in name resolution\nmore\nlines"),
     "cannot reach the Hugging Face hub"),
])
def test_push_without_a_network_is_one_error_line(monkeypatch, tmp_path, error, words):
    import dpgrpo.release.publish as publish

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(publish, "push_release", fail)
    result = CliRunner().invoke(app, ["push", str(tmp_path), "--repo-id", "me/model"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]
    assert type(error).__name__ in lines[0] and "not published" in lines[0]
    assert "Traceback" not in result.output


def test_push_names_a_refusal_by_the_hub_and_lets_bugs_through(monkeypatch, tmp_path):
    import dpgrpo.release.publish as publish

    class Response:
        status_code = 401

    class HubError(Exception):
        response = Response()
    HubError.__module__ = "huggingface_hub.errors"

    def refuse(*args, **kwargs):
        raise HubError("401 Client Error: Unauthorized")
    monkeypatch.setattr(publish, "push_release", refuse)
    result = CliRunner().invoke(app, ["push", str(tmp_path), "--repo-id", "me/model"])
    assert result.exit_code == 2 and "HTTP 401" in result.stderr and "HF_TOKEN" in result.stderr

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(publish, "push_release", bug)
    result = CliRunner().invoke(app, ["push", str(tmp_path), "--repo-id", "me/model"])
    assert isinstance(result.exception, ZeroDivisionError)        # not dressed as the network


# --- 3. audit mechanism's d -----------------------------------------------------------------

def test_audit_mechanism_states_the_certificates_d_beside_a_larger_simulated_one(tmp_path):
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "certificate.json").write_text(json.dumps(
        {"private": True, "epsilon": 8.0, "delta": 1e-4, "q": 0.05, "sigma": 0.6,
         "clip_norm": 0.055, "n": 200, "rounds": 3, "trainable_coordinates": 256}))
    base = ["audit", "mechanism", "--run", str(tmp_path), "--seed", "1", "--no-calibrate"]
    result = CliRunner().invoke(app, [*base, "--canaries", "400"])
    assert result.exit_code == 0, result.output
    assert "d = 400" in result.stdout
    assert ("the run's certificate states d = 256 trainable coordinates; the audit simulates "
            "d = 400 because its K = 400 orthonormal gradient canaries need at least K "
            "coordinates") in result.stdout
    assert "auditing the correct mechanism: 400 gradient canaries" in result.stderr
    result = CliRunner().invoke(app, [*base, "--canaries", "200"])
    assert result.exit_code == 0 and "d = 256" in result.stdout and "note:" not in result.output


# --- 4. help and output text ------------------------------------------------------------------

def test_help_shows_no_value_for_flags_and_keeps_bracketed_words():
    root = typer.main.get_command(app)
    for path, _ in [((), root), *_commands(root)]:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, path
        assert "<bool>" not in result.output, f"dpgrpo {' '.join(path)} --help"
    shown = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    assert "'dpgrpo[vllm]'" in shown
    mechanism = CliRunner().invoke(app, ["audit", "mechanism", "--help"],
                                   env={"COLUMNS": "200"}).output
    assert "--config" not in mechanism and "with CONFIG" in mechanism


def test_no_help_text_has_a_bracket_rich_would_eat():
    """rich markup drops an unescaped [word] (issue 57: 'dpgrpo[vllm]' showed as 'dpgrpo')."""
    root = typer.main.get_command(app)
    eaten = re.compile(r"(?<!\\)\[[a-z#/@][^\[\]]*\]")  # rich's tag, unescaped
    for path, cmd in [((), root), *_commands(root)]:
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        for text in texts:
            assert not eaten.search(text), f"dpgrpo {' '.join(path)}: {text!r}"


def test_convert_says_when_a_figure_is_vacuous_and_hides_none():
    result = CliRunner().invoke(app, ["privacy", "convert", "--epsilon", "8", "--delta", "1e-5",
                                      "--group", "3"])
    assert result.exit_code == 0, result.output
    assert "VACUOUS" in result.stdout and "a group of 3 prompts" in result.stdout
    assert "at least 1" in result.stdout and "--ledger" in result.stdout
    assert "None" not in result.stdout and "delta_pld" not in result.stdout
    fine = CliRunner().invoke(app, ["privacy", "convert", "--epsilon", "1", "--delta", "1e-5",
                                    "--relation", "replace-one"])
    assert "for one prompt swapped: (2, 3.72e-05)-DP" in fine.stdout
    assert "VACUOUS" not in fine.stdout


# --- 5. Ctrl-C ---------------------------------------------------------------------------------

def test_ctrl_c_while_importing_is_one_line_and_exit_130():
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.startswith('dpgrpo.cli') or name == 'typer':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "from dpgrpo.__main__ import main\n"
        "builtins.__import__ = imp\n"
        "main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip().splitlines() == ["interrupted while starting: nothing was done"]
    assert out.stdout == ""


def test_import_dpgrpo_imports_nothing_else():
    """A Ctrl-C can only be caught once ``dpgrpo.__main__.main`` runs; the console script first
    imports the package, so that import must be next to instant: it loads no module of dpgrpo
    and nothing outside the standard library's ``__future__`` (the names load on first use)."""
    code = ("import sys\nbefore = set(sys.modules)\nimport dpgrpo.__main__\n"
            "print(sorted(set(sys.modules) - before))\n"
            "from dpgrpo import RunConfig, ConfigError, load_config\n"
            "print(dpgrpo.config.RunConfig is RunConfig, dpgrpo.errors.ConfigError is ConfigError)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded, names = out.stdout.splitlines()
    assert set(eval(loaded)) <= {"dpgrpo", "dpgrpo.__main__", "__future__"}, loaded
    assert names == "True True"  # still there on first use, submodules too


def test_console_script_goes_through_the_guarded_entry_point():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dpgrpo"] == "dpgrpo.__main__:main"
    out = subprocess.run([sys.executable, "-m", "dpgrpo", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.startswith("dpgrpo ")


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    import dpgrpo.privacy.calibration as calibration

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(calibration, "calibrate", interrupt)
    with pytest.raises(SystemExit) as done:
        main(["privacy", "calibrate", "--n", "100", "--expected-batch", "4", "--rounds", "3",
              "--epsilon", "8"])
    assert done.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted"]


# --- setup.sh ---------------------------------------------------------------------------------

def test_setup_sh_says_what_it_installs_before_each_step():
    lines = (REPO / "scripts" / "setup.sh").read_text().splitlines()
    installs = [i for i, line in enumerate(lines) if "pip install" in line
                or line.strip().startswith('"$PY" -m venv')]
    assert len(installs) >= 5
    for i in installs:
        before = [line.strip() for line in lines[max(0, i - 3):i]]
        assert any(line.startswith("step ") for line in before), lines[i]
    assert any('step ".venv is up to date' in line for line in lines)


# --- 6. never silent: the heartbeat ------------------------------------------------------------

def test_heartbeat_speaks_after_silence_and_names_the_last_line(monkeypatch):
    import io
    import time

    from dpgrpo.cli._progress import Heartbeat

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Heartbeat(0.2, first="started dpgrpo x"):
        time.sleep(0.7)
        sys.stderr.write("calibrating sigma\n")
        time.sleep(0.7)
    assert sys.stderr is err  # the stream is restored
    lines = err.getvalue().splitlines()
    assert "... still working (last: started dpgrpo x)" in lines
    assert lines.count("calibrating sigma") == 1
    after = lines[lines.index("calibrating sigma") + 1:]
    assert after and set(after) == {"... still working (last: calibrating sigma)"}  # not its own
    with Heartbeat(0):  # DPGRPO_HEARTBEAT_S=0: off, nothing wrapped
        assert sys.stderr is err
        time.sleep(0.3)
    assert err.getvalue().splitlines() == lines


def _line_gaps(env: dict[str, str], sleep_s: float) -> tuple[float, list[float], list[str]]:
    """Run `dpgrpo privacy epsilon --json` with its accountant made ``sleep_s`` seconds slower
    (a long silent step) through a pipe: the seconds to the first line, the seconds between
    consecutive lines, the lines."""
    import os
    import time

    code = ("import time\n"
            "import dpgrpo.privacy.accounting as acc\n"
            "real = acc.epsilon_report\n"
            f"acc.epsilon_report = lambda *a, **k: (time.sleep({sleep_s}), real(*a, **k))[1]\n"
            "from dpgrpo.__main__ import main\n"
            "main(['privacy', 'epsilon', '--n', '100', '--expected-batch', '4', '--rounds', '3',"
            " '--sigma', '1.0', '--json'])\n")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    assert proc.stdout is not None
    times, lines = [], []
    for line in proc.stdout:
        times.append(time.monotonic())
        lines.append(line.rstrip("\n"))
    assert proc.wait() == 0, lines
    return times[0] - start, [b - a for a, b in pairwise(times)], lines


def test_a_long_silent_step_through_a_pipe_still_prints_a_line_every_interval():
    """The gap between two output lines stays near DPGRPO_HEARTBEAT_S (1 s here; 15 s by
    default) through an 8 s silent step; without the heartbeat that step is one 8 s gap."""
    _, gaps, lines = _line_gaps({"DPGRPO_HEARTBEAT_S": "1"}, sleep_s=8)
    assert json.loads(lines[-1])["epsilon"] > 0  # the result, untouched, on stdout
    beats = [x for x in lines if x.startswith("... still working")]
    assert len(beats) >= 4 and set(beats) == {"... still working (last: started dpgrpo privacy "
                                              "epsilon)"}
    assert max(gaps) < 4, gaps  # 1 s, plus what a busy machine adds
    first, gaps, lines = _line_gaps({"DPGRPO_HEARTBEAT_S": "0"}, sleep_s=8)  # off: silence
    assert len(lines) == 1 and first >= 8
