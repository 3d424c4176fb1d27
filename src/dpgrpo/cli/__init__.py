"""The ``dpgrpo`` command: a thin typer app over the library.

Each command group lives in its own module and registers itself through ``register(app)``.
Library errors (:class:`dpgrpo.errors.DPGRPOError`) become one-line messages and a non-zero
exit status here, in one place.

One grammar across commands: a command's config file is its positional argument; ``-o/--out``
names the output (a folder, or the file of commands that write one file); ``--json`` prints one
JSON object on stdout. (The spellings of 0.1, ``train --output-dir``, ``protocol --config``,
``verify --json FILE`` and ``privacy convert --replace-one``, were dropped in 0.2: CHANGELOG.md.)
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import typer

from dpgrpo import __version__
from dpgrpo.errors import DPGRPOError
from dpgrpo.rundir.atomic import full_message, read_only_message

#: Exit status after Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130

app = typer.Typer(
    name="dpgrpo",
    help="RLVR (GRPO) under prompt-level differential privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpgrpo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True,
        help="Print the version and exit.")) -> None:
    """RLVR (GRPO) under prompt-level differential privacy."""


def _flags_take_no_value() -> None:
    """Help shows no type for a flag: typer (0.2x) prints ``<bool>`` beside every flag, --help
    included, as if it took a value (issue 57). A flag's row keeps its name(s) and help."""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - another typer layout: its own help stands
        return
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "dpgrpo_flags", False):
        return

    def display_type_rich(self, ctx):  # typer's signature
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich.dpgrpo_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


def _register_all() -> None:
    from dpgrpo.cli import (
        audit,
        compare,
        data,
        evaluate,
        privacy,
        protocol,
        push,
        release,
        study,
        train,
        tune,
        verify,
    )

    for module in (privacy, verify, train, data, evaluate, compare, protocol, study, tune, audit,
                   push, release):
        module.register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dpgrpo`` console script (through :func:`dpgrpo.__main__.main`,
    which also turns a Ctrl-C during the imports into one line and exit status 130)."""
    from dpgrpo.cli._progress import Heartbeat, interrupted_said, reset_interrupted

    reset_interrupted()
    try:
        words = [w for w in (sys.argv[1:] if argv is None else argv)[:2] if not w.startswith("-")]
        with Heartbeat(first=" ".join(["started dpgrpo", *words])):  # never silent for long
            app(args=argv, standalone_mode=True)
    except SystemExit as done:  # typer turns Ctrl-C in a command into a silent exit 130
        if done.code == INTERRUPTED and not interrupted_said():
            typer.secho("interrupted", err=True, fg="yellow")
        raise
    except KeyboardInterrupt:  # outside a command (building the app, parsing)
        typer.secho("interrupted", err=True, fg="yellow")
        sys.exit(INTERRUPTED)
    except DPGRPOError as err:
        typer.secho(f"error: {err}", err=True, fg="red")
        sys.exit(2)
    except OSError as err:  # a full or read-only disk outside a guarded write: still one line
        if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = Path(err.filename) if err.filename else Path.cwd()
        message = full_message(where) if err.errno != errno.EROFS else read_only_message(where)
        typer.secho(f"error: {message}", err=True, fg="red")
        sys.exit(2)
