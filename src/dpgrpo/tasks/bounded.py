"""Run one verifier check under a wall-clock bound.

math-verify's own timeouts use ``signal.alarm``, which exists only in the main thread and has
whole-second resolution. :func:`run_bounded` works anywhere:

* in the main thread (the trainer, the evaluator, the CLI) it arms ``ITIMER_REAL`` and raises
  :class:`CheckTimeout` from the signal handler, restoring any timer and handler it displaced;
* in any other thread it sends the call to a persistent worker process (started once,
  reused) and kills and replaces that worker if the call overruns.

A signal can only interrupt Python bytecode, not one long C-level operation (a huge integer
power, say), so callers also refuse pathological inputs before the check
(:func:`dpgrpo.tasks.symbolic.is_pathological`).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Literal, TypeVar

T = TypeVar("T")
Mode = Literal["auto", "signal", "process"]

#: Seconds allowed for a fresh worker process to start and import its modules.
WORKER_START_TIMEOUT_S = 180.0
#: After the bound, the signal timer fires again every this many seconds until the call ends.
RETRY_INTERVAL_S = 0.05


class CheckTimeout(BaseException):
    """A bounded check ran out of time. A ``BaseException`` so that library code which
    swallows ``Exception`` (math-verify does) cannot hide it."""


def run_bounded(fn: Callable[..., T], args: tuple[object, ...], timeout_s: float, *,
                mode: Mode = "auto") -> tuple[T | None, bool]:
    """Call ``fn(*args)`` with a wall-clock bound; return ``(result, timed_out)``.

    ``mode="auto"`` uses a signal timer in the main thread and the worker process elsewhere.
    In process mode ``fn`` and ``args`` must be picklable (a module-level function).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    in_main = threading.current_thread() is threading.main_thread()
    if mode == "signal" or (mode == "auto" and in_main and hasattr(signal, "setitimer")):
        if not in_main:
            raise RuntimeError("signal-based timeouts work only in the main thread")
        return _run_with_signal(fn, args, timeout_s)
    return _WORKER.call(fn, args, timeout_s)


def _raise_timeout(signum: int, frame: object) -> None:
    raise CheckTimeout()


def _run_with_signal(fn: Callable[..., T], args: tuple[object, ...],
                     timeout_s: float) -> tuple[T | None, bool]:
    old_handler = signal.signal(signal.SIGALRM, _raise_timeout)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, 0)  # disarm and remember
    bound = min(timeout_s, old_delay) if old_delay > 0 else timeout_s
    start = time.monotonic()
    try:
        # The timer repeats: an alarm that lands in a finalizer or weakref callback, where
        # Python prints and swallows the exception, is followed by another one.
        signal.setitimer(signal.ITIMER_REAL, bound, RETRY_INTERVAL_S)
        try:
            return fn(*args), False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CheckTimeout:
        return None, True
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # give the displaced timer back what is left of it
            left = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _send(stream: IO[bytes], obj: object) -> None:
    payload = pickle.dumps(obj)
    stream.write(struct.pack("!Q", len(payload)) + payload)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError
    (size,) = struct.unpack("!Q", header)
    return pickle.loads(stream.read(size))


def serve(preload: tuple[str, ...] = ()) -> None:
    """Worker loop on stdin/stdout: import ``preload``, say ready, answer ``(fn, args)``."""
    import importlib

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the channel
    for name in preload:
        importlib.import_module(name)
    _send(out, ("ready", None))
    while True:
        try:
            fn, args = _receive(inp)
        except EOFError:
            return
        try:
            _send(out, ("ok", fn(*args)))
        except Exception as err:  # the parent re-raises it
            _send(out, ("error", err))


class _Worker:
    """One persistent child process that runs bounded calls for non-main threads.

    Started with ``python -c`` (not multiprocessing's spawn, which would re-import the
    caller's ``__main__``) and spoken to with pickles over its stdin/stdout.
    """

    preload: tuple[str, ...] = ("math_verify", "dpgrpo.tasks.symbolic")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        code = f"import dpgrpo.tasks.bounded as b; b.serve({self.preload!r})"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        if not _readable(proc.stdout, WORKER_START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError("the verifier worker process did not start")
        _receive(proc.stdout)
        return proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=5)
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
        self._proc = None

    def call(self, fn: Callable[..., T], args: tuple[object, ...],
             timeout_s: float) -> tuple[T | None, bool]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._proc = self._start()
            assert self._proc.stdin is not None and self._proc.stdout is not None
            _send(self._proc.stdin, (fn, args))
            if not _readable(self._proc.stdout, timeout_s):
                self._stop()  # the only way to interrupt it; the next call starts a new one
                return None, True
            status, value = _receive(self._proc.stdout)
            if status == "error":
                raise value
            return value, False


def _readable(stream: IO[bytes], timeout_s: float) -> bool:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return bool(ready)


_WORKER = _Worker()
