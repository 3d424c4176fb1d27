"""Progress that shows everywhere: a rich bar on a terminal, plain lines otherwise.

Under ``nohup``, CI or a pipe a rich bar prints nothing until it stops, so a long command looked
dead (issue 57). :func:`interactive` decides once per command (rich's own test, on stderr, so
``TTY_INTERACTIVE``/``TTY_COMPATIBLE``/``FORCE_COLOR`` are honoured); :func:`say` prints one
plain line on stderr (stdout stays for results and ``--json``).

Only public quantities are printed (invariant 6): rounds, epsilon spent, the count of problems
evaluated, and wall-clock times only where they say nothing about the private data. A training
run's per-round times do (issue 32: they track the realized batch size), so
:class:`RoundLines` prints elapsed time and ETA only when the caller allows it
(``train.public_timings = true`` or ``--show-private-telemetry``).

Between those lines a step can still take minutes (a round on a slow CPU, calibrating sigma, an
evaluation, an audit's scoring). :class:`Heartbeat`, around every command of ``dpgrpo``, prints
``... still working (last: <the last line>)`` on stderr whenever nothing was written on stdout or
stderr for :data:`HEARTBEAT_S` seconds (environment ``DPGRPO_HEARTBEAT_S``; ``0`` turns it off),
so no command is silent for longer, on a terminal or a pipe. Its lines state no time: how many
fall between two round lines says how long the round took to within that interval, as the live
bar's clock does on a terminal, and stay on the user's stderr (nothing is stored).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import typer

#: Seconds of silence on stdout and stderr after which :class:`Heartbeat` prints a line.
HEARTBEAT_S = 15.0
HEARTBEAT_ENV = "DPGRPO_HEARTBEAT_S"
_STILL = "... still working"


def interactive() -> bool:
    """Whether stderr is a terminal that can redraw a live bar."""
    from rich.console import Console

    return bool(Console(stderr=True).is_interactive)


_SAID = {"interrupted": False}


def say_interrupted(message: str) -> None:
    """The one line a command prints on Ctrl-C (before it exits 130); main() adds none then."""
    _SAID["interrupted"] = True
    typer.secho(message, err=True, fg="yellow")


def reset_interrupted() -> None:
    """A new command: nothing said yet."""
    _SAID["interrupted"] = False


def interrupted_said() -> bool:
    """Whether a command already said why it was interrupted."""
    return _SAID["interrupted"]


def say(message: str) -> None:
    """One plain line on stderr."""
    typer.echo(message, err=True)


@contextlib.contextmanager
def phase_lines() -> Iterator[None]:
    """Print the trainer's phase lines (logger ``dpgrpo.progress``: reading the data,
    calibrating sigma, loading the model) as plain lines on stderr while the block runs."""
    import logging

    class _Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"{record.getMessage()} ...")

    logger, handler = logging.getLogger("dpgrpo.progress"), _Say(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def duration(seconds: float) -> str:
    """``42s``, ``5m03s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))  # noqa: RUF046 - round() of a numpy float is a float before NumPy 2
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def round_line(info: dict[str, Any], *, first_round: int, timings: bool) -> str:
    """``round 2/3, epsilon spent <= 0.412`` (+ ``, elapsed 5m02s, ETA 2m31s`` with timings;
    + batch size and reward mean only when the trainer passed them: --show-private-telemetry).

    ``first_round`` is the first round this invocation reported (a resumed run starts late):
    the ETA extrapolates from the rounds run here, whose time ``info['elapsed']`` measures."""
    done, total = int(info["round"]), int(info["rounds"])
    parts = [f"round {done}/{total}", f"epsilon spent <= {info['epsilon']:.4g}"]
    if timings and info.get("elapsed") is not None:
        elapsed = float(info["elapsed"])
        here = done - first_round + 1
        parts.append(f"elapsed {duration(elapsed)}")
        if done < total and here > 0:
            parts.append(f"ETA {duration(elapsed / here * (total - done))}")
    if "batch_size" in info:  # private: only with --show-private-telemetry
        reward = info.get("reward_mean")
        reward_s = "-" if reward is None or reward != reward else f"{reward:.2f}"
        parts.append(f"batch {info['batch_size']} (private), reward {reward_s} (private)")
    return ", ".join(parts)


class RoundLines:
    """A training progress callback printing one plain line per round."""

    def __init__(self, *, timings: bool, write: Callable[[str], None] = say) -> None:
        self.timings, self.write = timings, write
        self.first: int | None = None

    def __call__(self, info: dict[str, Any]) -> None:
        if self.first is None:
            self.first = int(info["round"])
        self.write(round_line(info, first_round=self.first, timings=self.timings))


class CountLines:
    """``done/total`` progress as plain lines: at every tenth of the total, at most one line a
    minute in between, and the last one (public counts and times only)."""

    def __init__(self, label: str, *, every_s: float = 60.0,
                 write: Callable[[str], None] = say) -> None:
        self.label, self.every_s, self.write = label, every_s, write
        self.start = time.monotonic()
        self.last_line = self.start
        self.last_tenth = -1
        self.last_done = -1
        self.base: int | None = None      # done at the first call (a resumed job starts late)

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if self.base is None:
            self.base = done
        tenth = -1 if not total else int(10 * done / total)
        final = total is not None and done >= total
        if done == self.last_done or not (final or tenth > self.last_tenth
                                          or now - self.last_line >= self.every_s):
            return
        self.last_tenth, self.last_line, self.last_done = tenth, now, done
        elapsed = now - self.start
        line = f"{self.label}: {done}/{total if total else '?'}, elapsed {duration(elapsed)}"
        if total and self.base < done < total:
            line += f", ETA {duration(elapsed / (done - self.base) * (total - done))}"
        self.write(line)


class _Watched:
    """A text stream that notes when it was last written to (and its last stderr line)."""

    def __init__(self, stream: TextIO, beat: Heartbeat, *, keep_line: bool) -> None:
        self._stream, self._beat, self._keep_line = stream, beat, keep_line

    def write(self, text: str) -> int:
        if text:
            self._beat.last = time.monotonic()
            if self._keep_line and text.strip() and not text.startswith(_STILL):
                self._beat.line = text.strip().splitlines()[-1]
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Heartbeat:
    """While the block runs, print ``... still working (last: LINE)`` on stderr after every
    ``every_s`` seconds in which nothing was written on ``sys.stdout`` or ``sys.stderr``.

    A daemon thread, no lock (a fork or a held lock cannot hang a child); a live rich bar
    writes several times a second, so on a terminal it only speaks where no bar does."""

    def __init__(self, every_s: float | None = None, *, first: str = "starting") -> None:
        if every_s is None:
            try:
                every_s = float(os.environ.get(HEARTBEAT_ENV, HEARTBEAT_S))
            except ValueError:
                every_s = HEARTBEAT_S
        self.every_s = every_s
        self.last = time.monotonic()
        self.line = first  # what the lines name until the command prints one
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple[TextIO, TextIO] | None = None

    def __enter__(self) -> Heartbeat:
        if not self.every_s > 0:
            return self
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Watched(sys.stdout, self, keep_line=False)  # type: ignore[assignment]
        sys.stderr = _Watched(sys.stderr, self, keep_line=True)  # type: ignore[assignment]
        self.last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="dpgrpo-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self.last + self.every_s - time.monotonic())):
            if time.monotonic() - self.last < self.every_s:
                continue
            line = self.line if len(self.line) <= 72 else self.line[:69] + "..."
            try:
                sys.stderr.write(f"{_STILL} (last: {line})\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # stderr closed (a pipe's reader gone): stay quiet
                return
            self.last = time.monotonic()
