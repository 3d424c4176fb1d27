"""Run untrusted code and its unit tests in a sandboxed subprocess (the code tasks' verifier).

:func:`run_tests` runs ``program`` followed by ``tests`` in a fresh ``python -I -S -B`` process
(isolated mode: no environment variables, no user or site packages, no bytecode written) whose
working directory is a fresh temporary directory, and reports whether the tests ran to the end.
Every failure is a failed verdict, never an exception in the caller: syntax errors, exceptions,
timeouts, memory exhaustion, excess output, crashes, forbidden actions, or a sandbox that could
not start.

Layers (the child side is ``_sandbox_child.py``):

* **namespaces** (:func:`isolation`): where ``unshare --user --map-root-user --net`` works,
  the child (``unshare`` execs the interpreter, so it is the very process the parent waits
  for and reaps) runs in new user and network namespaces: no network interface but an unused
  loopback. Otherwise (``unshare`` missing, or unprivileged user namespaces disabled, as on
  some CI images) the audit hook alone keeps it off the network.
* **resource limits** set by the child before the program runs: address space
  (``memory_bytes``), CPU seconds, file size (``output_bytes``: stdout and stderr go to a file,
  so this caps output), no new processes (RLIMIT_NPROC = 0; the kernel does not enforce it for
  root, where the audit hook alone stops forks), 64 open files, no core dumps.
* **an audit hook** (PEP 578) that ends the child at the first forbidden action (exit 97):
  fork/exec/spawn/system/subprocess, threads, sockets, signals to other processes, ctypes, new
  code or function objects, tracing, the gc's object lists; reading files outside the work
  directory and the standard library; writing anything outside the work directory.
* **a wall-clock timeout** in the parent, which then kills the child's process group.
* **the pass signal** is a fresh 128-bit nonce the hook prints only after the tests returned;
  the program's functions may return only plain builtin data, and the tests run on a saved
  copy of the builtins: ``sys.exit(0)``, ``os._exit(0)``, objects equal to everything and
  patched builtins all fail.

The audit hook is a guard against accidents and naive exploits, not a security boundary:
CPython's audit hooks can be bypassed by code written to subvert the interpreter itself. Run
untrusted adversarial code inside a container or VM as well.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net")
FORBIDDEN_EXIT = 97
_EXITS = {0: "failed", 1: "failed", 2: "syntax-error", 3: "memory", FORBIDDEN_EXIT: "forbidden"}
_SIGNALS = {signal.SIGXCPU: "timeout", signal.SIGKILL: "timeout", signal.SIGXFSZ: "output-limit"}


@dataclass(frozen=True)
class SandboxLimits:
    """Public limits of one sandboxed run."""

    timeout_s: float = 3.0              # wall clock; the CPU limit is its ceiling in seconds
    memory_bytes: int = 512 * 2**20     # address space of the child
    output_bytes: int = 2**20           # stdout + stderr, and any one file written
    namespaces: bool = True             # use Linux namespaces when available (:func:`isolation`)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.memory_bytes < 64 * 2**20 or self.output_bytes < 1024:
            raise ValueError(f"sandbox limits out of range: {self}")


@dataclass(frozen=True)
class SandboxResult:
    """What happened: ``passed`` only if every test ran and the pass nonce came back."""

    passed: bool
    status: str          # passed, failed, syntax-error, timeout, memory, output-limit,
                         # forbidden, crashed, error (the sandbox itself could not run)
    returncode: int | None
    seconds: float
    output: str          # the first 2,000 characters of stdout + stderr (for debugging)

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether ``unshare`` can create user and network namespaces here (probed once)."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def isolation(limits: SandboxLimits = SandboxLimits()) -> dict[str, str]:
    """Which mechanisms a run with ``limits`` uses on this machine (for logs and bench/README)."""
    spaces = limits.namespaces and namespaces_available()
    return {
        "network": ("new network namespace (unshare --net) and audit hook (sockets)" if spaces
                    else "audit hook: socket creation and connection end the child"),
        "processes": ("audit hook (fork, exec, spawn, threads) and RLIMIT_NPROC = 0 (not "
                      "enforced for root); the process group is killed at the end"),
        "files": "audit hook: reads in the work directory and stdlib only, writes in the work "
                 "directory only; RLIMIT_FSIZE",
        "memory": f"RLIMIT_AS = {limits.memory_bytes} bytes",
        "time": f"{limits.timeout_s:g} s wall clock, RLIMIT_CPU = {_cpu_seconds(limits)} s",
        "output": f"{limits.output_bytes} bytes (RLIMIT_FSIZE on the output file)",
        "interpreter": f"{sys.executable} -I -S -B",
    }


def _cpu_seconds(limits: SandboxLimits) -> int:
    return max(1, math.ceil(limits.timeout_s))


def _status(returncode: int | None, output: bytes, nonce: bytes, timed_out: bool,
            limit: int) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0 and output.rstrip().endswith(nonce):
        return "passed"
    if len(output) >= limit:
        return "output-limit"
    if returncode is None:
        return "error"
    if returncode < 0:
        return _SIGNALS.get(-returncode, "crashed")
    if returncode > 128 and returncode - 128 in _SIGNALS:  # a shell-style signal status
        return _SIGNALS[returncode - 128]
    return _EXITS.get(returncode, "crashed")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (it leads its own session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def run_tests(program: str, tests: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``program`` then ``tests`` (which raise on failure) in the sandbox; never raises.

    The tests run in a namespace holding the program's names, so they may call its functions
    (HumanEval: ``check(candidate)``).
    """
    start = time.perf_counter()
    root = None
    try:
        root = Path(tempfile.mkdtemp(prefix="dpgrpo-sandbox-"))
        work = root / "work"
        work.mkdir()
        nonce = secrets.token_hex(16).encode("ascii")
        payload = json.dumps({
            "program": program, "tests": tests, "nonce": nonce.decode("ascii"),
            "workdir": str(work), "limits": {"memory_bytes": limits.memory_bytes,
                                             "cpu_seconds": _cpu_seconds(limits),
                                             "file_bytes": limits.output_bytes}}).encode()
        prefix = list(_UNSHARE) if limits.namespaces and namespaces_available() else []
        command = [*prefix, sys.executable, "-I", "-S", "-B", "-c", _CHILD.read_text()]
        env = {"PATH": os.defpath, "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
        returncode, timed_out = None, False
        with open(root / "output", "wb") as out:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=work, env=env,
                                    start_new_session=True)
            try:
                proc.communicate(payload, timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill(proc)  # also on CheckTimeout or KeyboardInterrupt in the caller
            returncode = proc.returncode
        with open(root / "output", "rb") as out:
            output = out.read(limits.output_bytes + 64)
        status = _status(returncode, output, nonce, timed_out, limits.output_bytes)
        text = output.replace(nonce, b"").decode("utf-8", "replace").strip()[:2000]
        return SandboxResult(status == "passed", status, returncode,
                             time.perf_counter() - start, text)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return SandboxResult(False, "error", None, time.perf_counter() - start,
                             f"{type(err).__name__}: {err}")
    finally:
        if root is not None:
            _remove(root)


def _remove(root: Path) -> None:
    """Delete the run's directories, whatever permissions the program left on them."""
    def retry(function: object, path: str, _: object) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        except OSError:
            pass

    shutil.rmtree(root, onerror=retry)


__all__ = ["FORBIDDEN_EXIT", "SandboxLimits", "SandboxResult", "isolation",
           "namespaces_available", "run_tests"]
