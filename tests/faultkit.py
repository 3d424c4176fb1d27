"""Test-only fault injection: run a function in a forked child and SIGKILL it at a chosen call.

A forked child shares the parent's imported modules (no interpreter start-up, no re-import of
torch), patches one function so that its n-th call kills the process with SIGKILL (no
``finally`` blocks, no cleanup: exactly what ``kill -9`` or a power loss leaves behind), and
runs the target. The parent then inspects the run directory and resumes it in-process.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any, Callable

KILLED = -signal.SIGKILL


def die() -> None:
    """SIGKILL this process now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_on_call(owner: Any, name: str, nth: int = 1, *, when: str = "before",
                 match: Callable[..., bool] | None = None) -> None:
    """Patch ``owner.name`` so that its ``nth`` matching call kills the process.

    ``when="before"`` dies before the call runs, ``"after"`` right after it returns.
    ``match(*args, **kwargs)`` selects which calls count (default: every call).
    """
    original = getattr(owner, name)
    calls = [0]

    def patched(*args: Any, **kwargs: Any) -> Any:
        if match is None or match(*args, **kwargs):
            calls[0] += 1
            if calls[0] == nth:
                if when == "before":
                    die()
                result = original(*args, **kwargs)
                die()
                return result
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def run_in_child(target: Callable[[], Any]) -> int:
    """Run ``target()`` in a forked child; return its exit code (negative: killed by signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            target()
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else 1
        except BaseException:  # noqa: BLE001 - report and exit with a distinct status
            traceback.print_exc()
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
