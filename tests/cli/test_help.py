"""Every command has help text, and the CLI starts without importing torch or scipy."""

from __future__ import annotations

import subprocess
import sys

import typer
from typer.testing import CliRunner

from dpgrpo.cli import app


def _commands(group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            yield from _commands(cmd, (*prefix, name))


def test_every_command_has_help_text():
    root = typer.main.get_command(app)
    found = list(_commands(root))
    names = {" ".join(path) for path, _ in found}
    assert {"train", "verify", "eval", "compare", "protocol", "privacy calibrate",
            "privacy epsilon", "privacy report", "data summary", "audit mia",
            "audit canary", "rescore", "score", "push"} <= names
    for path, cmd in found:
        assert (cmd.help or cmd.short_help or "").strip(), f"`dpgrpo {' '.join(path)}` has no help"
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output


def test_cli_import_is_light():
    code = ("import sys, dpgrpo.cli; "
            "print(sorted(m for m in ('torch', 'scipy', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
