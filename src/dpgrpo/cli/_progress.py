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
"""

from __future__ import annotations

import time
from typing import Any, Callable

import typer


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


def duration(seconds: float) -> str:
    """``42s``, ``5m03s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))
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
