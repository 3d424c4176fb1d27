"""``python -m dpgrpo`` and the ``dpgrpo`` console script (pyproject ``[project.scripts]``).

This module imports nothing of the CLI until :func:`main` runs, so that a Ctrl-C while the CLI
is still importing (typer, rich, the commands) gives one line and exit status 130, as a Ctrl-C
later does, instead of a ``KeyboardInterrupt`` traceback (issue 57).
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, as dpgrpo.cli.INTERRUPTED


def main(argv: list[str] | None = None) -> None:
    """Import the CLI, then run it."""
    try:
        from dpgrpo.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while starting: nothing was done\n")
        sys.stderr.flush()
        raise SystemExit(INTERRUPTED) from None
    cli_main(argv)


if __name__ == "__main__":
    main()
