"""Every `dpgrpo ...` command line the README and docs/*.md show (in code blocks and in the prose's
code spans) names a command that exists and only options that command has (its `--help` through
typer's CliRunner, in-process, nothing trained); the few that are cheap and need no GPU, hub or
run directory are also run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL = {"bash", "console", "sh", "shell", "shell-session", ""}
#: Where a command line stops being dpgrpo's arguments.
STOP = {"|", ">", ">>", "2>", "2>&1", "&&", "||", ";", "&"}
#: Run in full (fast, offline, no GPU, no run directory): (doc, command) prefixes. Every other
#: command (training, a GPU, the hub, a run directory the reader made) is checked for its
#: subcommand and options only.
RUN_IN_FULL = ("dpgrpo --version", "dpgrpo privacy epsilon ", "dpgrpo privacy convert --epsilon ",
               "dpgrpo data summary --task math --data-dir ../shared/data --skip-invalid")


def _commands() -> list[tuple[str, int, str]]:
    """(doc, line, command) of every dpgrpo command line: in ```bash/console fences (``$ ``
    prompts stripped) and in indented code blocks, continuation lines joined."""
    found = []
    for doc in DOCS:
        lines, shell, fence = doc.read_text(encoding="utf-8").splitlines(), False, False
        i = 0
        while i < len(lines):
            line, number = lines[i], i + 1
            m = FENCE.match(line.strip())
            if m:
                fence, shell = (not fence), (not fence and m.group(1) in SHELL)
                i += 1
                continue
            indented = not fence and line.startswith("    ")
            text = line.strip().removeprefix("$ ")
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            if (shell or indented) and text.startswith("dpgrpo "):
                found.append((doc.relative_to(ROOT).as_posix(), number, text))
            i += 1
    return found


INLINE = re.compile(r"`(dpgrpo [^`]+)`")


def _inline_commands() -> list[tuple[str, int, str]]:
    """(doc, line, command) of each `dpgrpo ...` code span in the prose."""
    found = []
    for doc in DOCS:
        fence = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line.strip()):
                fence = not fence
            elif not fence:
                found += [(doc.relative_to(ROOT).as_posix(), number, m.group(1))
                          for m in INLINE.finditer(line)]
    return found


COMMANDS = _commands() + _inline_commands()


def _app() -> typer.Typer:
    from dpgrpo.cli import app

    return app


def _subcommands(command: Any) -> dict[str, Any]:
    """A group's subcommands ({} for a command); typer 0.2x vendors click, so no isinstance."""
    return dict(getattr(command, "commands", None) or {})


def _tokens(command: str) -> list[str]:
    text = re.sub(r"(^|\s)#.*$", "", command)  # a trailing comment
    out = []
    for token in shlex.split(text):
        if token in STOP:
            break
        out.append(token)
    return out[1:]  # without "dpgrpo"


def _resolve(tokens: list[str]) -> tuple[list[str], Any, list[str]]:
    """The subcommand path, its click command, and the remaining arguments."""
    command = typer.main.get_command(_app())
    path: list[str] = []
    rest = list(tokens)
    while _subcommands(command) and rest and not rest[0].startswith("-"):
        sub = _subcommands(command).get(rest[0])
        if sub is None:
            raise AssertionError(f"no command 'dpgrpo {' '.join([*path, rest[0]])}' "
                                 f"(known: {sorted(_subcommands(command))})")
        path.append(rest.pop(0))
        command = sub
    return path, command, rest


def _options(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names |= set(param.opts) | set(param.secondary_opts)
    return names


def test_the_docs_show_dpgrpo_commands():
    docs = {doc for doc, _, _ in COMMANDS}
    assert len(COMMANDS) > 30 and {"README.md", "docs/usage.md", "docs/auditing.md"} <= docs
    assert any(c.startswith("dpgrpo release check") for _, _, c in COMMANDS)
    assert "release" in _subcommands(typer.main.get_command(_app()))   # registered


@pytest.mark.parametrize("doc,line,command", COMMANDS,
                         ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_each_command_and_its_options_exist(doc, line, command):
    path, leaf, rest = _resolve(_tokens(command))
    if _subcommands(leaf):
        assert not rest or rest[0] in _options(leaf), f"{doc}:{line}: '{command}' names no command"
    out = CliRunner().invoke(_app(), [*path, "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, f"{doc}:{line}: dpgrpo {' '.join(path)} --help: {out.output}"
    known = _options(leaf)
    used = {t.split("=", 1)[0] for t in rest if t.startswith("-") and t != "-" and t != "..."}
    unknown = sorted(used - known)
    assert not unknown, (f"{doc}:{line}: '{command}': dpgrpo {' '.join(path)} has no option "
                         f"{unknown} (it has {sorted(known)})")


@pytest.mark.parametrize("doc,line,command",
                         [c for c in COMMANDS if c[2].startswith(RUN_IN_FULL)],
                         ids=[f"{d}:{n}" for d, n, c in COMMANDS if c.startswith(RUN_IN_FULL)])
def test_the_cheap_commands_run(doc, line, command, shared_data_dir, monkeypatch):
    monkeypatch.chdir(ROOT)  # ../shared/data is relative to the checkout, as the docs say
    out = CliRunner().invoke(_app(), _tokens(command))
    assert out.exit_code == 0, f"{doc}:{line}: '{command}' exited {out.exit_code}: {out.output}"
