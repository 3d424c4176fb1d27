"""The code verifier's sandbox: hostile completions score 0 and leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from dpgrpo.tasks import sandbox
from dpgrpo.tasks.sandbox import SandboxLimits, namespaces_available, run_tests

REPO_FILE = Path(__file__).resolve()
TESTS = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\n\ncheck(f)\n"
GOOD = "def f(x):\n    return 2 * x\n"
FAST = SandboxLimits(timeout_s=1.5)
SPACES = [True, False] if namespaces_available() else [False]


def _session_members(sid: int) -> list[int]:
    """Live processes whose session id is ``sid`` (the child leads its own session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
                members.append(int(entry.name))
    return members


@pytest.fixture
def spawned(monkeypatch):
    """The pids of the sandbox processes a test starts."""
    pids: list[int] = []
    original = subprocess.Popen

    def spy(*args, **kwargs):
        proc = original(*args, **kwargs)
        pids.append(proc.pid)
        return proc

    monkeypatch.setattr(sandbox.subprocess, "Popen", spy)
    return pids


@pytest.mark.parametrize("namespaces", SPACES)
def test_correct_code_passes_and_wrong_code_fails(namespaces):
    limits = SandboxLimits(namespaces=namespaces)
    ok = run_tests(GOOD, TESTS, limits)
    assert ok.passed and ok.status == "passed" and ok.returncode == 0 and ok.seconds < 5
    wrong = run_tests("def f(x):\n    return x + 2\n", TESTS, limits)  # right for 2 only
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.output
    assert run_tests("def f(x):\n    return (\n", TESTS, limits).status == "syntax-error"
    # the standard library imports and works; files may be written inside the sandbox
    lib = ("from typing import List\nimport collections, re, math, tempfile\n"
           "P = collections.namedtuple('P', 'a b')\nopen('scratch.txt', 'w').write('x')\n"
           "tempfile.mkdtemp()\n" + GOOD)
    assert run_tests(lib, TESTS, limits).passed


HOSTILE = {  # name: (program, expected status)
    "infinite loop": ("def f(x):\n    while True:\n        pass\n", "timeout"),
    "sleep": ("import time\ndef f(x):\n    time.sleep(60)\n", "timeout"),
    "os.system": ("import os\nos.system('touch {marker}')\n" + GOOD, "forbidden"),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', '{marker}'])\n" + GOOD,
                   "forbidden"),
    "huge allocation": ("def f(x):\n    block = bytearray(10**11)\n    return 2 * x\n", "memory"),
    "1 GB allocation": ("def f(x):\n    block = bytearray(10**9)\n    return 2 * x\n", "memory"),
    "write outside": ("open('{marker}', 'w').write('x')\n" + GOOD, "forbidden"),
    "write parent": ("open('../escaped', 'w').write('x')\n" + GOOD, "forbidden"),
    "mkdir outside": ("import os\nos.mkdir('{marker}')\n" + GOOD, "forbidden"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "forbidden"),
    "read /etc/passwd": ("data = open('/etc/passwd').read()\n" + GOOD, "forbidden"),
    "read caught": ("try:\n    open('/etc/passwd').read()\nexcept Exception:\n    pass\n" + GOOD,
                    "forbidden"),
    "read the repo": (f"data = open({str(REPO_FILE)!r}).read()\n" + GOOD, "forbidden"),
    "list the repo": (f"import os\nos.listdir({str(REPO_FILE.parent)!r})\n" + GOOD, "forbidden"),
    "network socket": ("import socket\nsocket.create_connection(('127.0.0.1', 22))\n" + GOOD,
                       "forbidden"),
    "ctypes": ("import ctypes\n" + GOOD, "forbidden"),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + GOOD,
                        "forbidden"),
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", "failed"),
    "os._exit(0)": ("import os\nos._exit(0)\n", "failed"),
    "equal to all": ("class A:\n    def __eq__(self, other):\n        return True\n"
                     "def f(x):\n    return A()\n", "failed"),
    "patched builtins": ("import builtins\nbuiltins.AssertionError = None\n"
                         "builtins.len = lambda x: 0\ndef f(x):\n    return x\n", "failed"),
    "forged pass event": ("import sys\nsys.audit('dpgrpo.passed')\n" + GOOD, "forbidden"),
    "huge output": ("print('x' * 10**7)\n" + GOOD, "output-limit"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completions_score_zero_and_leave_nothing(name, tmp_path, spawned):
    marker = tmp_path / "pwned"
    program, status = HOSTILE[name]
    result = run_tests(program.replace("{marker}", str(marker)), TESTS, FAST)
    assert not result.passed and result.status == status, (result.status, result.output)
    assert not marker.exists() and not (tmp_path.parent / "escaped").exists()
    assert result.seconds < FAST.timeout_s + 3
    assert spawned and all(_session_members(pid) == [] for pid in spawned)  # all killed


@pytest.mark.parametrize("namespaces", SPACES)
def test_network_processes_and_timeouts_in_both_isolation_modes(namespaces, spawned):
    limits = SandboxLimits(timeout_s=1.0, namespaces=namespaces)
    for program, status in (HOSTILE["network socket"], HOSTILE["fork bomb"],
                            HOSTILE["infinite loop"]):
        result = run_tests(program, TESTS, limits)
        assert result.status == status and not result.passed
    assert all(_session_members(pid) == [] for pid in spawned)


def test_the_temporary_directory_is_removed_and_failures_never_raise(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    chmod = "import os\nos.mkdir('locked')\nopen('locked/f', 'w').close()\nos.chmod('locked', 0)\n"
    assert run_tests(chmod + GOOD, TESTS).passed
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(sandbox.sys, "executable", str(tmp_path / "no-such-python"))
    broken = run_tests(GOOD, TESTS, SandboxLimits(namespaces=False))
    assert broken.status == "error" and not broken.passed and os.listdir(tmp_path) == []


def test_isolation_names_the_mechanisms():
    info = sandbox.isolation(SandboxLimits(namespaces=False))
    assert info["network"].startswith("audit hook") and "-I -S" in info["interpreter"]
    if namespaces_available():
        assert "unshare --net" in sandbox.isolation()["network"]
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
