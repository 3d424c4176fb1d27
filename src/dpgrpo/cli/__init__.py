"""The ``dpgrpo`` command: a thin typer app over the library.

Each command group lives in its own module and registers itself through ``register(app)``.
Library errors (:class:`dpgrpo.errors.DPGRPOError`) become one-line messages and a non-zero
exit status here, in one place.
"""

from __future__ import annotations

import sys

import typer

from dpgrpo.errors import DPGRPOError

app = typer.Typer(
    name="dpgrpo",
    help="RLVR (GRPO) under prompt-level differential privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_all() -> None:
    from dpgrpo.cli import (audit, compare, data, evaluate, privacy, protocol, study, train,
                            verify)

    for module in (privacy, verify, train, data, evaluate, compare, protocol, study, audit):
        module.register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dpgrpo`` console script."""
    try:
        app(args=argv, standalone_mode=True)
    except DPGRPOError as err:
        typer.secho(f"error: {err}", err=True, fg="red")
        sys.exit(2)
