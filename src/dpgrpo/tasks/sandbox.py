"""Run untrusted code against unit tests with the verdict computed outside it (the verifier).

:func:`run_tests` scores ``program`` against ``tests`` in two layers (docs/code-sandbox.md):

* **the OS layer** (:mod:`dpgrpo.tasks.isolation`): every process that runs the completion's
  code is a fresh ``python -I -S -B`` in new user, mount, PID, network, IPC and UTS namespaces,
  on a read-only root holding only the interpreter and its standard library, with a tmpfs work
  directory; when :func:`run_tests` returns, the namespace and every process in it are gone.
  Where no launcher works, :func:`run_tests` raises :class:`IsolationUnavailable` (a
  ConfigError) instead of running unisolated. Under bubblewrap a libseccomp filter refuses new
  processes, threads, sockets, mounts and namespaces
  (:func:`dpgrpo.tasks.isolation.seccomp_filter`);
* **the Python layer** in that process (``_sandbox_child.py``): rlimits and an audit hook that
  ends it at the first forbidden action (exit 97).

The verdict is never computed by the completion's process: it receives the calls the tests make
(names and plain-data arguments) and writes back the plain values its functions return
(``_sandbox_wire.py``). Literal checks (:func:`dpgrpo.tasks.testplan.call_plan`) are compared
here, in the trusted parent; other tests run in a second sandboxed process
(``_sandbox_tests.py``) that holds the problem's ``question`` and reaches the completion only
through proxies of the question's stubs. Objects equal to everything, frame inspection and a
patched harness therefore gain nothing: the expected values never enter the completion's
process, and its other names (a redefined ``abs``, a helper) never reach the tests.

Every failure of the completion is a failed verdict, never an exception: syntax errors,
exceptions, timeouts, memory, output, crashes, forbidden actions, a sandbox that did not start.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from dpgrpo.tasks import _sandbox_wire as wire
from dpgrpo.tasks.isolation import (
    WORKDIR,
    IsolationUnavailable,
    Launcher,
    launcher,
    layout,
    require_isolation,
    seccomp_filter,
)
from dpgrpo.tasks.testplan import Call, call_plan, remote_names

_HERE = Path(__file__).parent
FORBIDDEN_EXIT = 97
PASSED_LINE = b"dpgrpo-tests: passed"
_EXITS = {0: "failed", 1: "failed", 2: "syntax-error", 3: "memory", FORBIDDEN_EXIT: "forbidden"}
_SIGNALS: dict[int, str] = {signal.SIGXCPU: "timeout", signal.SIGKILL: "timeout",
                            signal.SIGXFSZ: "output-limit"}


@dataclass(frozen=True)
class SandboxLimits:
    """Public limits of one sandboxed run."""

    timeout_s: float = 3.0              # wall clock; the CPU limit is its ceiling in seconds
    memory_bytes: int = 512 * 2**20     # address space of each sandboxed process
    output_bytes: int = 2**20           # stdout + stderr, any one file written, one answer

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.memory_bytes < 64 * 2**20 or self.output_bytes < 1024:
            raise ValueError(f"sandbox limits out of range: {self}")


@dataclass(frozen=True)
class SandboxResult:
    """What happened: ``passed`` only if every test ran and held, judged outside the code."""

    passed: bool
    status: str          # passed, failed, syntax-error, timeout, memory, output-limit,
                         # forbidden, crashed, error (the sandbox itself could not run)
    returncode: int | None   # the completion's process
    seconds: float
    output: str          # the first 2,000 characters of its stdout + stderr, then the tests'

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"


def namespaces_available() -> bool:
    """Whether a launcher (bubblewrap or unshare) isolates processes here (probed once)."""
    return launcher() is not None


def isolation(limits: SandboxLimits = SandboxLimits()) -> dict[str, str]:
    """Which mechanisms a run with ``limits`` uses on this machine (for logs and bench/README)."""
    found = launcher()
    spaces = (f"{found.name}: new user, mount, PID, network, IPC, UTS namespaces" if found
              else "none works here: code tasks refuse to run")
    return {
        "launcher": spaces,
        "files": f"read-only root with the interpreter and its stdlib only; tmpfs {WORKDIR}; "
                 "audit hook on reads and writes; RLIMIT_FSIZE",
        "network": "empty network namespace; audit hook on sockets",
        "processes": "PID namespace killed at the end; audit hook on fork, exec; "
                     "RLIMIT_NPROC = 0 (not enforced where the host uid is root)",
        "seccomp": (f"libseccomp filter ({found.seccomp}): no processes, threads, sockets, "
                    "tracing, mounts, namespaces" if found and found.seccomp else
                    "none: " + (seccomp_filter()[1] if found and found.name == "bwrap"
                                else "only with bubblewrap")),
        "verdict": "outside the completion's process (trusted parent or a tests process)",
        "memory": f"RLIMIT_AS = {limits.memory_bytes} bytes",
        "time": f"{limits.timeout_s:g} s wall clock, RLIMIT_CPU = {_cpu_seconds(limits)} s",
        "output": f"{limits.output_bytes} bytes (RLIMIT_FSIZE on the output file)",
        "interpreter": f"{layout().interpreter if found else '?'} -I -S -B",
    }


def _cpu_seconds(limits: SandboxLimits) -> int:
    return max(1, math.ceil(limits.timeout_s))


def _code(name: str) -> str:
    return (_HERE / "_sandbox_wire.py").read_text() + "\n\n" + (_HERE / name).read_text()


class _Jail:
    """One sandboxed interpreter: the launcher process, its output file and its payload."""

    def __init__(self, found: Launcher, script: str, payload: dict, output: Path,
                 fds: tuple[int, ...]) -> None:
        lay = layout()
        # the last argument names this run in ps (and lets tests find any leftover process)
        argv = [lay.interpreter, "-I", "-S", "-B", "-c", _code(script),
                f"dpgrpo-sandbox-{secrets.token_hex(8)}"]
        self.output = output
        with open(output, "wb") as out:
            self.proc = found.popen(lay, argv, fds, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={"PATH": os.defpath}, cwd=output.parent)
        self.pid1 = _pid1_fd(self.proc)
        try:
            stdin = cast(IO[bytes], self.proc.stdin)             # stdin=PIPE: never None
            stdin.write(json.dumps(payload).encode())  # read whole before anything
            stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def wait(self, seconds: float) -> bool:
        """True if it ended within ``seconds``; then every process of its namespace is gone."""
        try:
            self.proc.wait(max(seconds, 0))
        except subprocess.TimeoutExpired:
            return False
        self._end_namespace(grace=2.0)
        return True

    def kill(self) -> None:
        """SIGKILL the namespace's pid 1, wait until the kernel has killed every process of the
        namespace, and reap the launcher."""
        self._end_namespace(grace=0.0)
        if self.proc.poll() is None:
            children = _children(self.proc.pid)
            for pid in children:
                _kill_child(pid, self.proc.pid)
            if not children or not self.wait(5):  # not started yet: its own death kills it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def _end_namespace(self, grace: float) -> None:
        """Wait for the namespace's pid 1 to be gone, killing it after ``grace`` seconds.

        Bubblewrap's launcher exits as soon as pid 1 reports the command's exit status, a moment
        before pid 1 itself exits; pid 1's exit completes only once the kernel has killed and
        reaped every other process of its namespace, and that is when its pidfd turns readable.
        """
        if self.pid1 is None:
            return
        try:
            if not _readable(self.pid1, grace):
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pid1, signal.SIGKILL)
                _readable(self.pid1, 10.0)
        finally:
            os.close(self.pid1)
            self.pid1 = None

    def read(self, limit: int) -> bytes:
        with open(self.output, "rb") as out:
            return out.read(limit)


def _pid1_fd(proc: subprocess.Popen, patience: float = 2.0) -> int | None:
    """A pidfd of the launcher's child (the namespace's pid 1), taken while the launcher lives,
    so that it names that process even after the launcher is gone; None if there is none."""
    deadline = time.monotonic() + patience
    while proc.poll() is None:
        for pid in _children(proc.pid):
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            if _parent(pid) == proc.pid:  # checked after opening: the fd names that child
                return fd
            os.close(fd)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0005)
    return None


def _readable(fd: int, seconds: float) -> bool:
    """True once the process behind pidfd ``fd`` has ended (within ``seconds``)."""
    return bool(select.select([fd], [], [], max(seconds, 0))[0])


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_child(pid: int, parent: int) -> None:
    """SIGKILL ``pid`` through a pidfd, only if it is still ``parent``'s child (no pid reuse)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _parent(pid) == parent:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _status(returncode: int | None, output: bytes, limit: int) -> str:
    """How the completion's process ended (``failed`` for a normal exit)."""
    if len(output) >= limit:
        return "output-limit"
    if returncode is None:
        return "error"
    if returncode < 0:
        return _SIGNALS.get(-returncode, "crashed")
    if returncode > 128 and returncode - 128 in _SIGNALS:  # the launcher reports 128 + signal
        return _SIGNALS[returncode - 128]
    return _EXITS.get(returncode, "crashed")


def run_tests(program: str, tests: str, limits: SandboxLimits = SandboxLimits(), *,
              question: str = "") -> SandboxResult:
    """Run ``program`` against ``tests`` (which raise on failure); never raises for anything the
    program does. ``question``, the problem's own code, is trusted: the tests see its helpers
    from its text, and the program's other names through the sandbox.

    Raises :class:`IsolationUnavailable` where no launcher isolates processes.
    """
    found = require_isolation()
    start = time.perf_counter()
    try:
        ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        return SandboxResult(False, "syntax-error", None, time.perf_counter() - start,
                             f"{type(err).__name__}: {err}"[:2000])
    root = None
    try:
        root = Path(tempfile.mkdtemp(prefix="dpgrpo-sandbox-"))
        plan = call_plan(tests)
        if plan is not None:
            return _run_plan(found, program, plan, limits, root, start)
        return _run_with_tests(found, program, tests, question, limits, root, start)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return SandboxResult(False, "error", None, time.perf_counter() - start,
                             f"{type(err).__name__}: {err}")
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _limits(limits: SandboxLimits) -> dict:
    return {"memory_bytes": limits.memory_bytes, "cpu_seconds": _cpu_seconds(limits),
            "file_bytes": limits.output_bytes}


def _run_plan(found: Launcher, program: str, plan: list[Call], limits: SandboxLimits,
              root: Path, start: float) -> SandboxResult:
    """Literal checks: the completion answers the calls, this process compares."""
    read, write = os.pipe()
    calls = [[c.name, wire.encode(list(c.args)), wire.encode(c.kwargs)] for c in plan]
    try:
        jail = _Jail(found, "_sandbox_child.py",
                     {"program": program, "limits": _limits(limits), "workdir": WORKDIR,
                      "calls": calls, "response_fd": write}, root / "output", (write,))
    finally:
        os.close(write)
    try:
        answers, timed_out = _read_all(read, start + limits.timeout_s, 4 * limits.output_bytes)
        timed_out = timed_out or not jail.wait(start + limits.timeout_s - time.perf_counter())
    finally:
        os.close(read)
        jail.kill()
    output = jail.read(limits.output_bytes + 64)
    code = jail.proc.returncode
    problems = _compare(answers, plan)
    if not timed_out and code == 0 and not problems:
        status = "passed"
    else:
        status = "timeout" if timed_out else _status(code, output, limits.output_bytes)
    text = output.decode("utf-8", "replace").strip()
    if problems and status != "passed":
        text = f"{text}\n{problems}".strip()
    return SandboxResult(status == "passed", status, code, time.perf_counter() - start,
                         text[:2000])


def _read_all(fd: int, deadline: float, limit: int) -> tuple[bytes, bool]:
    """Everything written to ``fd`` until end of file (True: the deadline came first)."""
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return b"".join(chunks), True
            if not selector.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk or size > limit:
                return b"".join(chunks), False
            chunks.append(chunk)
            size += len(chunk)


def _compare(answers: bytes, plan: list[Call]) -> str:
    """'' if the answers are exactly the expected values, else the first difference."""
    lines = answers.split(b"\n")
    for i, call in enumerate(plan):
        if i >= len(lines) - 1:
            return f"AssertionError: no answer for check {i + 1} of {len(plan)}"
        try:
            reply = json.loads(lines[i])
            if type(reply) is not dict or set(reply) not in ({"v"}, {"e"}):
                raise ValueError("not one value")
            if "e" in reply:
                return f"AssertionError: check {i + 1}: {call.name} raised {str(reply['e'])[:100]}"
            value = wire.decode(reply["v"])
            equal = value == call.expected
        except Exception as err:  # any malformed answer is a failed check
            return f"AssertionError: check {i + 1}: bad answer ({type(err).__name__})"
        if not equal:
            return f"AssertionError: check {i + 1}: {call.name} returned {repr(value)[:200]}"
    return ""


def _run_with_tests(found: Launcher, program: str, tests: str, question: str,
                    limits: SandboxLimits, root: Path, start: float) -> SandboxResult:
    """Other tests: a second sandboxed process runs them against proxies of the program."""
    deadline = start + limits.timeout_s
    request_r, request_w = os.pipe()
    answer_r, answer_w = os.pipe()
    jails: list[_Jail] = []
    try:
        jails.append(_Jail(found, "_sandbox_child.py",
                           {"program": program, "limits": _limits(limits), "workdir": WORKDIR,
                            "request_fd": request_r, "response_fd": answer_w},
                           root / "output", (request_r, answer_w)))
        jails.append(_Jail(found, "_sandbox_tests.py",
                           {"question": question, "tests": tests, "limits": _limits(limits),
                            "remote": remote_names(program, question),
                            "request_fd": request_w, "response_fd": answer_r},
                           root / "tests-output", (request_w, answer_r)))
    except BaseException:
        for jail in jails:
            jail.kill()
        raise
    finally:
        for fd in (request_r, request_w, answer_r, answer_w):
            os.close(fd)
    child, runner = jails
    try:
        timed_out = not runner.wait(deadline - time.perf_counter())
        child.wait(min(0.5, deadline - time.perf_counter()))
    finally:
        runner.kill()
        child.kill()
    output = child.read(limits.output_bytes + 64)
    tests_output = runner.read(limits.output_bytes + 64)
    passed = (not timed_out and runner.proc.returncode == 0 and
              tests_output.rstrip().endswith(PASSED_LINE))
    if passed:
        status = "passed"
    elif timed_out:
        status = "timeout"
    else:
        status = _status(child.proc.returncode, output, limits.output_bytes)
        if status == "failed" and runner.proc.returncode in (3, 128 + signal.SIGXCPU):
            status = "memory" if runner.proc.returncode == 3 else "timeout"
    text = (output.decode("utf-8", "replace").strip() + "\n" +
            tests_output.replace(PASSED_LINE, b"").decode("utf-8", "replace").strip())
    return SandboxResult(passed, status, child.proc.returncode, time.perf_counter() - start,
                         text.strip()[:2000])


__all__ = ["FORBIDDEN_EXIT", "IsolationUnavailable", "SandboxLimits", "SandboxResult",
           "isolation", "namespaces_available", "run_tests"]
