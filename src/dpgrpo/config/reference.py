"""docs/config.md, generated from the config dataclasses' field comments (issue 28).

Every key of a run config, its default and what it does, read with ast from
:mod:`dpgrpo.config.schema` (no import, no torch): a field's comment is the comment lines just
above it and its inline comment. ``python -m dpgrpo.config.reference > docs/config.md``
rewrites the page; ``tests/test_config_reference.py`` fails when the page is not current.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SCHEMA = Path(__file__).with_name("schema.py")
#: TOML table -> the dataclass behind it, in the page's order
SECTIONS = {"model": "ModelConfig", "data": "DataConfig", "privacy": "PrivacyConfig",
            "train": "TrainConfig", "audit": "AuditConfig"}


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


def fields(source: str | None = None) -> dict[str, list[tuple[str, str, str]]]:
    """section -> [(key, default, what it does)], in the dataclasses' order."""
    text = SCHEMA.read_text(encoding="utf-8") if source is None else source
    lines = text.splitlines()
    inline = _inline_comments(text)
    classes = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}
    out: dict[str, list[tuple[str, str, str]]] = {}
    for section, name in SECTIONS.items():
        rows = []
        for stmt in classes[name].body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            default = ast.get_source_segment(text, stmt.value) if stmt.value is not None else ""
            default = " ".join((default or "").split())
            words = _comment_above(lines, stmt.lineno)
            what = " ".join([*words, inline.get(stmt.end_lineno or stmt.lineno, "")]).strip()
            rows.append((stmt.target.id, default, what))
        out[section] = rows
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(source: str | None = None) -> str:
    """The page: one table per TOML table."""
    parts = ["# Configuration reference", "",
             "Every key of a run config (TOML tables, `--set section.key=value`, the API's "
             "`overrides`), its default and what it does. Generated from the field comments of "
             "`src/dpgrpo/config/schema.py` by `python -m dpgrpo.config.reference > "
             "docs/config.md`; a test fails when this page is not current. `None` means unset "
             "(leave the key out of the TOML file, or `--set key=none`).", ""]
    for section, rows in fields(source).items():
        parts += [f"## [{section}]", "", "| key | default | what it does |", "| --- | --- | --- |"]
        parts += [f"| `{section}.{key}` | `{_cell(default)}` | {_cell(what) or '-'} |"
                  for key, default, what in rows]
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
