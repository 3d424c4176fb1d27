"""docs/config.md, generated from the schema of every table a user writes (issues 28, 59).

Every key of a run config ([model] [data] [privacy] [train] [audit], :mod:`dpgrpo.config.schema`)
and of the experiment tables ([protocol] [study] [tune], :mod:`dpgrpo.config.experiments`): its
type (the choices of a ``Literal``), its default and what it does. A field's comment is the
comment lines just above it and its inline comment, read with ast from the class's source; the
type and the default come from the dataclass itself (torch-free).
``python -m dpgrpo.config.reference > docs/config.md`` rewrites the page;
``tests/test_config_reference.py`` fails when the page is not current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
import typing
from pathlib import Path
from typing import Literal

from dpgrpo.config.experiments import EXPERIMENT_TABLES
from dpgrpo.config.schema import AuditConfig, DataConfig, ModelConfig, PrivacyConfig, TrainConfig
from dpgrpo.config.values import field_type

#: TOML table -> the dataclass behind it, in the page's order
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "privacy": PrivacyConfig,
                             "train": TrainConfig, "audit": AuditConfig, **EXPERIMENT_TABLES}
#: the run config's tables (the rest are the experiment tables of the commands)
RUN_SECTIONS = ("model", "data", "privacy", "train", "audit")


def _comment_above(lines: list[str], line: int) -> list[str]:
    """The comment lines directly above source line ``line`` (1-based)."""
    out: list[str] = []
    i = line - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return out


def _inline_comments(text: str) -> dict[int, str]:
    """Line (1-based) -> the comment that ends it after code (tokenize: never inside a string)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.line[:tok.start[1]].strip():
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def comments(text: str, class_name: str) -> dict[str, str]:
    """Field name -> what it does (its comments), for class ``class_name`` of source ``text``."""
    lines = text.splitlines()
    inline = _inline_comments(text)
    classes = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}
    out = {}
    for stmt in classes[class_name].body if class_name in classes else ():
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            words = _comment_above(lines, stmt.lineno)
            out[stmt.target.id] = " ".join(
                [*words, inline.get(stmt.end_lineno or stmt.lineno, "")]).strip()
    return out


def toml(value: object) -> str:
    """A default as a TOML file writes it (None: unset)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and hasattr(value, "name"):
        return str(value.name)
    return repr(value)


def type_text(cls: type, name: str) -> str:
    """A field's type as the page names it: a number, a list of strings, one of a | b, ..."""
    base, optional = field_type(cls, name)
    origin = typing.get_origin(base)
    if origin is Literal:
        text = " \\| ".join(f'"{c}"' for c in typing.get_args(base))
    elif origin is tuple:
        inner = typing.get_args(base)[0]
        if typing.get_origin(inner) is Literal:
            text = "list of " + " \\| ".join(f'"{c}"' for c in typing.get_args(inner))
        elif inner in (int, float, str):
            text = "list of " + {int: "integers", float: "numbers", str: "strings"}[inner]
        else:
            text = "table"  # read into records (tune.grid's points)
    elif origin is not None or base in (dict,):
        text = "table"
    else:
        text = {int: "integer", float: "number", bool: "boolean", str: "string"}.get(
            base, str(base))
    return f"{text} or None" if optional else text


def _default(f: dataclasses.Field[object]) -> str:
    if f.default is not dataclasses.MISSING:
        return toml(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return toml(f.default_factory())
    return "(required)"


def fields(sections: dict[str, type] | None = None) -> dict[str, list[tuple[str, str, str, str]]]:
    """table -> [(key, type, default, what it does)], in the dataclasses' order."""
    out: dict[str, list[tuple[str, str, str, str]]] = {}
    for section, cls in (sections or SECTIONS).items():
        what = comments(Path(inspect.getfile(cls)).read_text(encoding="utf-8"), cls.__name__)
        out[section] = [(f.name, type_text(cls, f.name), _default(f), what.get(f.name, ""))
                        for f in dataclasses.fields(cls)]
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(section: str, rows: list[tuple[str, str, str, str]]) -> list[str]:
    parts = [f"## [{section}]", "", "| key | type | default | what it does |",
             "| --- | --- | --- | --- |"]
    parts += [f"| `{section}.{key}` | {kind} | `{_cell(default)}` | {_cell(what) or '-'} |"
              for key, kind, default, what in rows]
    return [*parts, ""]


def render(sections: dict[str, type] | None = None) -> str:
    """The page: one table per TOML table, the run config's first, then the experiments'."""
    found = fields(sections)
    parts = ["# Configuration reference", "",
             "Every key of every TOML table a user writes: the run config's tables (also "
             "`--set section.key=value` and the API's `overrides`) and the experiment tables of "
             "`dpgrpo protocol`, `dpgrpo study` and `dpgrpo tune`, which the commands' options "
             "override. One strict loader reads them all: an unknown key, or a value of another "
             "type (a string for a boolean, a float for an integer, inf or nan), is refused "
             "with the file, the table and the key. Generated from the schema "
             "(`src/dpgrpo/config/schema.py`, `src/dpgrpo/config/experiments.py`) by `python -m "
             "dpgrpo.config.reference > docs/config.md`; a test fails when this page is not "
             "current. `None` means unset (leave the key out of the TOML file, or `--set "
             "key=none`).", "", "# The run config", ""]
    for section, rows in found.items():
        if section not in RUN_SECTIONS:
            continue
        parts += _table(section, rows)
    parts += ["# The experiment tables", "",
              "Settings of one command each, kept in the same file as the run config they "
              "start from and stripped before that config is built.", ""]
    for section, rows in found.items():
        if section in RUN_SECTIONS:
            continue
        parts += _table(section, rows)
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
