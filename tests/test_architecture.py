"""The package's import graph has no circles (docs/architecture.md, issue 13).

Built with ast, without importing anything: an edge A -> B for every ``import`` of a dpgrpo
module B in A. Module-level imports (``if TYPE_CHECKING:`` blocks included: a circle hidden
from the interpreter is still a circle between files) must form no cycle. Imports inside
functions are counted separately: their only allowed circle is the rollout engine factory
(rollout.engine picks an implementation that imports the engine interface back).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ALLOWED_DEFERRED: list[set[str]] = []


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in (SRC / "dpgrpo").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges: set[str] = set()

        def visit(node: ast.AST, top: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inside = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)) and (top or not module_level_only):
                    if isinstance(child, ast.Import):
                        targets = [a.name for a in child.names]
                    else:
                        base = child.module or ""
                        if child.level:
                            here = name.split(".") if package else name.split(".")[:-1]
                            here = here[:len(here) - child.level + 1]
                            base = ".".join([*here, *([child.module] if child.module else [])])
                        targets = [base, *(f"{base}.{a.name}" for a in child.names)]
                    for target in targets:
                        found = resolve(target) if target.startswith("dpgrpo") else None
                        # a package's submodule importing its parent is not a circle of files
                        if found and found != name and not name.startswith(found + "."):
                            edges.add(found)
                visit(child, top and not inside)

        visit(ast.parse(path.read_text(encoding="utf-8")), True)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_graph_sees_the_package():
    graph = _graph(module_level_only=True)
    assert len(graph) > 80
    assert "dpgrpo.privacy.accounting" in graph["dpgrpo.privacy.calibration"]
    assert "dpgrpo.reports.comparison" in graph["dpgrpo.reports.tables"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle_among_module_level_imports():
    assert _cycles(_graph(module_level_only=True)) == []


def test_deferred_imports_close_no_new_circle():
    cycles = _cycles(_graph(module_level_only=False))
    assert [c for c in cycles if c not in ALLOWED_DEFERRED] == []
