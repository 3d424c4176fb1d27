"""The code verifier's sandbox: verdicts, both verdict modes, the wire, isolation and its refusal.

The attacks themselves are in test_hostile_completions.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dpgrpo.errors import ConfigError
from dpgrpo.tasks import _sandbox_wire as wire
from dpgrpo.tasks import isolation as iso
from dpgrpo.tasks import sandbox
from dpgrpo.tasks.sandbox import SandboxLimits, namespaces_available, run_tests
from dpgrpo.tasks.testplan import Call, call_plan, remote_names

TESTS = ("def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\n"
         "\ncheck(f)\n")
LOOPED = ("def check(candidate):\n    for x in (2, 5):\n        assert candidate(x) == 2 * x\n"
          "\ncheck(f)\n")
GOOD = "def f(x):\n    return 2 * x\n"
MODES = pytest.mark.parametrize("tests", [TESTS, LOOPED], ids=["call-plan", "tests-process"])
isolated = pytest.mark.skipif(not namespaces_available(),
                              reason="no OS isolation here: the code tasks refuse to run")


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_the_wire_round_trips_exact_builtin_data_and_refuses_the_rest():
    values = [None, True, 0, -7, 10**5000, 1.5, float("inf"), -0.0, "é\n\ud800", b"\x00\xff",
              1 + 2j, [1, [2]], (1, (2,)), {1, 2}, frozenset({3}), {"a": 1, (1, 2): [3]}, ()]
    for value in values:
        back = wire.loads(wire.dumps(value))
        assert back == value and type(back) is type(value)
    assert str(wire.loads(wire.dumps(-0.0))) == "-0.0"

    class Sneaky(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    for bad in (Sneaky(1), [Sneaky(1)], {Sneaky(1): 1}, object(), len, type, _deep(200)):
        with pytest.raises(TypeError):
            wire.encode(bad)
    for bad in ('{"t": "eq", "v": []}', '{"t": "tuple"}', '{"x": 1}', '{"t": "i", "v": 3}',
                "[" * 10000):
        with pytest.raises((ValueError, RecursionError)):
            wire.loads(bad)


def test_literal_checks_become_a_call_plan_and_other_tests_do_not():
    plan = call_plan('METADATA = {"a": 1}\n' + TESTS.replace("(5)", "(5, y=[1, -2])"))
    assert plan == [Call("f", (2,), {}, 4), Call("f", (5,), {"y": [1, -2]}, 10)]
    assert call_plan("def check(c):\n    assert c(1) == 2, 'msg'\n    assert True\n\ncheck(g)\n") \
        == [Call("g", (1,), {}, 2)]
    for other in (LOOPED, "def check(c):\n    assert abs(c(1) - 2) < 1e-6\n\ncheck(f)\n",
                  "import math\n" + TESTS, "def check(c):\n    assert c(x) == 2\n\ncheck(f)\n",
                  "def check(c):\n    assert c(1) != 2\n\ncheck(f)\n", "check(f)\n", "", "def ("):
        assert call_plan(other) is None


def test_the_tests_process_keeps_the_question_helpers_and_reaches_the_rest():
    question = ("import math\ndef helper(x):\n    return x + 1\n\n"
                "def f(x):\n    \"\"\"Stub.\"\"\"\n")
    program = (question + "\ndef f(x):\n    return helper(x)\nimport os as extra\nK = 3\n"
               "def abs(x):\n    return 0\n")
    assert remote_names(program, question) == ["f"]  # only the stub the completion writes
    assert remote_names(GOOD + "def abs(x):\n    return 0\nK = 1\n", "") == ["K", "f"]


@pytest.fixture
def started(monkeypatch):
    """The marker argument (``dpgrpo-sandbox-<hex>``) of every sandboxed process started."""
    markers: list[str] = []
    original = sandbox.subprocess.Popen

    def spy(command, *args, **kwargs):
        markers.extend(m for arg in command
                       for m in re.findall(r"dpgrpo-sandbox-[0-9a-f]{16}", arg))
        return original(command, *args, **kwargs)

    monkeypatch.setattr(sandbox.subprocess, "Popen", spy)
    return markers


def _alive_with(markers: list[str]) -> list[int]:
    """Live processes whose command line holds one of ``markers``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
            found += [int(entry.name)] if any(m in cmdline for m in markers) else []
    return found


@isolated
@MODES
def test_correct_code_passes_and_wrong_code_fails(tests):
    # the verdict comes when the process ends, not at its deadline (120 s away: a bound no
    # load reaches, where the old 5 s absolute bound failed on a busy machine)
    ok = run_tests(GOOD, tests, SandboxLimits(timeout_s=120))
    assert ok.passed and ok.status == "passed" and ok.returncode == 0 and ok.seconds < 60
    wrong = run_tests("def f(x):\n    return x + 2\n", tests)  # right for 2 only
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.output
    syntax = run_tests("def f(x):\n    return (\n", tests)
    assert syntax.status == "syntax-error" and syntax.returncode is None  # no process started
    # the standard library imports and works; files may be written inside the sandbox
    lib = ("from typing import List\nimport collections, re, math, tempfile, hashlib, json\n"
           "P = collections.namedtuple('P', 'a b')\nopen('scratch.txt', 'w').write('x')\n"
           "tempfile.mkdtemp()\nhashlib.md5(b'x').hexdigest()\n" + GOOD)
    assert run_tests(lib, tests).passed


PASS_LINE = sandbox.PASSED_LINE.decode()
FAKE_PASS = {  # wrong answers; the sandbox's own pass line ends the completion's output
    "printed at import": f"print({PASS_LINE!r}, flush=True)\ndef f(x):\n    return -1\n",
    "printed by each call": f"def f(x):\n    print({PASS_LINE!r}, flush=True)\n    return -1\n",
    "on stderr": f"import sys\ndef f(x):\n    sys.stderr.write({PASS_LINE!r} + '\\n')\n"
                 "    return -1\n",
}


@isolated
@MODES
@pytest.mark.parametrize("name", list(FAKE_PASS))
def test_the_pass_line_the_completion_prints_is_not_a_verdict(tests, name):
    """Issue 56, S01/S02: the verdict ignores the completion's output. A completion with
    wrong answers that prints the tests process's pass line (``PASSED_LINE``) as the last line
    of its output scores 0 in both modes."""
    from dpgrpo.tasks.base import Problem
    from dpgrpo.tasks.code import unit_tests

    result = run_tests(FAKE_PASS[name], tests)
    assert PASS_LINE in result.output  # the line was printed and reached the parent
    assert not result.passed and result.status == "failed", (result.status, result.output)
    response = f"```python\n{FAKE_PASS[name]}```"
    assert not unit_tests(response, Problem("fake-pass", "", tests)).correct


@isolated
def test_the_tests_process_sees_helpers_exceptions_and_tuples():
    question = "def helper(x):\n    return x * 2\n\ndef f(x):\n    \"\"\"Double x.\"\"\"\n"
    program = (question + "\ndef f(x):\n    if x < 0:\n        raise ValueError(x)\n"
               "    return (helper(x), [x])\n")
    tests = ("def check(candidate):\n    assert candidate(3) == (helper(3), [3])\n"
             "    try:\n        candidate(-1)\n    except ValueError:\n        pass\n"
             "    else:\n        assert False\n\ncheck(f)\n")
    assert run_tests(program, tests, question=question).passed
    cheat = question + "\ndef helper(x):\n    return 0\ndef f(x):\n    return (0, [x])\n"
    assert not run_tests(cheat, tests, question=question).passed  # the helper stays trusted
    tolerant = "def check(candidate):\n    assert abs(candidate(3) - 6.5) < 1e-9\n\ncheck(f)\n"
    assert run_tests(question + "\ndef f(x):\n    return x * 2 + 0.5\n", tolerant,
                     question=question).passed
    shadow = question + "\ndef abs(x):\n    return 0\ndef f(x):\n    return 0\n"
    assert not run_tests(shadow, tolerant, question=question).passed  # builtins stay trusted


SLEEP_S = 600  # a completion that sleeps: only the wall-clock deadline can end it


@isolated
@MODES
def test_limits_end_in_their_statuses(tests, started):
    """Each limit ends the run in its status and kills every process of it. No absolute
    wall-clock bound (``seconds < timeout + 5`` failed on a loaded machine): the sleeper
    (no CPU, so no RLIMIT_CPU) shows the deadline kills, by ending long before its sleep."""
    fast = SandboxLimits(timeout_s=1.0)
    cases = {"def f(x):\n    while True:\n        pass\n": "timeout",
             f"import time\ndef f(x):\n    time.sleep({SLEEP_S})\n": "timeout",
             "def f(x):\n    block = bytearray(10**9)\n    return 2 * x\n": "memory",
             "print('x' * 10**7)\n" + GOOD: "output-limit",
             "import os\nos.system('true')\n" + GOOD: "forbidden"}
    for program, status in cases.items():
        before = len(started)
        result = run_tests(program, tests, fast)
        assert not result.passed and result.status == status, (status, result)
        assert result.seconds < SLEEP_S / 2     # killed at the deadline, never waited out
        assert len(started) > before and _alive_with(started[before:]) == []  # all killed


@isolated
def test_the_temporary_directory_is_removed_and_failures_never_raise(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    chmod = "import os\nos.mkdir('locked')\nopen('locked/f', 'w').close()\nos.chmod('locked', 0)\n"
    assert run_tests(chmod + GOOD, TESTS).passed and run_tests(chmod + GOOD, LOOPED).passed
    assert os.listdir(tmp_path) == []
    lay = iso.layout()
    monkeypatch.setattr(sandbox, "layout", lambda: iso.Layout(
        str(tmp_path / "no-such-python"), lay.files, lay.stdlib, lay.hidden))
    for tests in (TESTS, LOOPED):
        broken = run_tests(GOOD, tests)
        assert not broken.passed and broken.status != "passed"
    assert os.listdir(tmp_path) == []


def test_without_isolation_the_code_tasks_refuse(monkeypatch):
    monkeypatch.setattr(iso, "_chosen", lambda: (None, "bwrap: not installed; unshare: "
                                                       "Operation not permitted"))
    with pytest.raises(ConfigError, match=r"code tasks need OS-level isolation.*bwrap: not "
                                          r"installed.*apt-get install bubblewrap"):
        run_tests(GOOD, TESTS)
    from dpgrpo.tasks import get_task
    from dpgrpo.tasks.base import Problem

    with pytest.raises(iso.IsolationUnavailable):
        get_task("code").verify("```python\ndef f(x):\n    return 2 * x\n```",
                                Problem("p", "def f(x):\n    pass\n", TESTS))
    assert sandbox.isolation()["launcher"].startswith("none works here")


@isolated
def test_isolation_names_the_mechanisms():
    info = sandbox.isolation()
    assert info["launcher"].split(":")[0] in ("bwrap", "unshare")
    assert "-I -S" in info["interpreter"] and "PID" in info["launcher"]
    assert "outside" in info["verdict"]
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)


@pytest.mark.parametrize("name", ["bwrap", "unshare"])
def test_each_launcher_builds_the_same_sandbox(name, monkeypatch):
    """Both launchers, where they work: a read-only root with only the interpreter, its
    libraries and its stdlib; pid 2 of a fresh PID namespace; the tmpfs work directory."""
    path = shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin")
    if path is None:
        pytest.skip(f"{name} is not installed here")
    found = iso.Launcher(name, path)
    problem = iso._probe(found)
    if problem is not None:
        pytest.skip(f"{name} cannot create the namespaces here: {problem}")
    monkeypatch.setattr(sandbox, "require_isolation", lambda: found)
    hidden = (iso.layout().hidden or [iso.layout().stdlib + "/site-packages"])[0]
    probe = ("import os, sys, sqlite3\n"
             "def f(x):\n    out = [os.getpid(), os.getcwd()]\n"
             "    for path in ('/etc', '/home', '/work', '/tmp', '/proc', '/usr/bin', "
             f"{hidden!r} + '/torch'):\n"
             "        try:\n            os.stat(path)\n            out.append(path)\n"
             "        except OSError:\n            pass\n"
             "    for path in ('/x.db', sys.prefix + '/lib/x.db', 'ok.db'):\n"
             "        try:\n            sqlite3.connect(path).execute('create table t (x)')\n"
             "            out.append('wrote ' + path)\n"
             "        except sqlite3.Error:\n            out.append('refused ' + path)\n"
             "    return out\n")
    tests = "def check(candidate):\n    assert candidate(0) == 0\n\ncheck(f)\n"
    result = run_tests(probe, tests)
    seen = eval(result.output.split("returned ", 1)[1])  # our own repr of a list
    prefix = os.path.dirname(os.path.dirname(iso.layout().stdlib))
    assert 1 < seen[0] < 100, seen  # a fresh PID namespace; pid 1 is the reaper
    if name == "unshare":  # the empty mount point umount needed; nothing is mounted there
        seen.remove("/proc")
    assert seen[1:] == [iso.WORKDIR, "refused /x.db", f"refused {prefix}/lib/x.db", "wrote ok.db"]


@isolated
def test_with_seccomp_the_kernel_refuses_threads_and_processes():
    """Threads raise no audit event in CPython 3.11 and a renamed ``_posixsubprocess`` slips
    past the hook's module list: the seccomp filter refuses both (clone: EPERM)."""
    found = iso.launcher()
    if found.seccomp is None:
        pytest.skip(f"no seccomp filter here: {iso.seccomp_filter()[1]}")
    program = (
        "import threading, importlib.util, glob, os, sys\n"
        "def f(x):\n    out = []\n"
        "    try:\n        threading.Thread(target=print).start()\n        out.append('thread')\n"
        "    except RuntimeError:\n        out.append('no thread')\n"
        "    path = glob.glob(os.path.dirname(os.__file__) "
        "+ '/lib-dynload/_posixsubprocess*.so')[0]\n"
        "    spec = importlib.util.spec_from_file_location('ok._posixsubprocess', path)\n"
        "    ps = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(ps)\n"
        "    r, w = os.pipe()\n"
        "    try:\n        ps.fork_exec([sys.executable], [os.fsencode(sys.executable)], True, (),"
        " None, None, -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1, None,"
        " False)\n        out.append('process')\n"
        "    except OSError as err:\n        out.append(err.errno)\n    return out\n")
    result = run_tests(program, "def check(candidate):\n    assert candidate(0) == 0\n\ncheck(f)\n")
    assert "returned ['no thread', 1]" in result.output, result.output


class _ShellLauncher:
    """A stand-in launcher whose first child outlives it, as bubblewrap's pid 1 can for a
    moment after the launcher has reported the command's exit status."""

    def __init__(self, script: str) -> None:
        self.script = script

    def popen(self, layout, argv, pass_fds=(), **kwargs):
        return subprocess.Popen(["/bin/sh", "-c", self.script], pass_fds=pass_fds, **kwargs)


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return False


def _jail(script: str, tmp_path):
    jail = sandbox._Jail(_ShellLauncher(script), "_sandbox_child.py", {}, tmp_path / "out", ())
    assert jail.pid1 is not None
    return jail, sandbox._children(jail.proc.pid)[0]


def test_a_normal_end_waits_for_the_namespace_pid_1(tmp_path):
    """The launcher exits at once; its child (the namespace's pid 1) lives 0.6 s more: the
    jail's wait returns only once that child has ended."""
    jail, pid1 = _jail("sleep 0.6 & exec sleep 0.05", tmp_path)
    assert jail.wait(5)
    assert not _alive(pid1)


def test_a_kill_ends_the_namespace_pid_1_before_returning(tmp_path):
    jail, pid1 = _jail("sleep 30 & wait", tmp_path)
    assert _alive(pid1)
    jail.kill()
    assert not _alive(pid1) and jail.proc.returncode is not None
