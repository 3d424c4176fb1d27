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
from typing import Optional

import typer

from dpgrpo import __version__
from dpgrpo.errors import DPGRPOError
from dpgrpo.rundir.atomic import full_message, read_only_message

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
def _root(version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True,
        help="Print the version and exit.")) -> None:
    """RLVR (GRPO) under prompt-level differential privacy."""


def _register_all() -> None:
    from dpgrpo.cli import (
        audit,
        compare,
        data,
        evaluate,
        privacy,
        protocol,
        push,
        study,
        train,
        tune,
        verify,
    )

    for module in (privacy, verify, train, data, evaluate, compare, protocol, study, tune, audit,
                   push):
        module.register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dpgrpo`` console script."""
    try:
        app(args=argv, standalone_mode=True)
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
