"""What a problem's tests need from the completion, read from their syntax (trusted side only).

The verdict is computed outside the completion's process (docs/code-sandbox.md), in one of two
ways:

* a **call plan** (:func:`call_plan`) when the tests are a list of literal checks, as the
  embedded ``code`` task's are and many HumanEval problems' are::

      def check(candidate):
          assert candidate(1, [2, 3]) == 6
      check(entry)

  The completion's process is sent only the calls (name and arguments); the trusted parent
  compares the plain values that come back with the expected literals;
* otherwise the tests run in a second sandboxed process that holds the problem's own code
  (``question``) and sees the completion's functions only as proxies (:func:`remote_names`).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from typing import TypeGuard


@dataclass(frozen=True)
class Call:
    """One literal check: ``name(*args, **kwargs) == expected``."""

    name: str
    args: tuple
    kwargs: dict
    expected: object


def call_plan(tests: str) -> list[Call] | None:
    """The literal checks of ``tests``, or None if they do anything else."""
    try:
        module = ast.parse(tests)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    checks: dict[str, tuple[str, list[ast.stmt]]] = {}
    plan: list[Call] = []
    for node in module.body:
        if _is_inert(node) or (isinstance(node, ast.Assign) and _literal(node.value)[0]
                               and all(isinstance(t, ast.Name) and t.id.isupper()
                                       for t in node.targets)):
            continue  # docstrings and METADATA = {...}
        if (isinstance(node, ast.FunctionDef) and len(node.args.args) == 1 and not
                node.decorator_list and not node.args.vararg and not node.args.kwarg and
                not node.args.kwonlyargs and not node.args.defaults):
            checks[node.name] = (node.args.args[0].arg, node.body)
            continue
        target = _call_of_check(node, checks)
        if target is None:
            return None
        parameter, body = checks[target[0]]
        calls = _checks(body, parameter, target[1])
        if calls is None:
            return None
        plan += calls
    return plan or None


def _is_inert(node: ast.stmt) -> bool:
    return isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and
                                          isinstance(node.value, ast.Constant))


def _call_of_check(node: ast.stmt, checks: dict) -> tuple[str, str] | None:
    """(check name, entry point) of a statement ``check(entry)``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    if (isinstance(call.func, ast.Name) and call.func.id in checks and len(call.args) == 1
            and not call.keywords and isinstance(call.args[0], ast.Name)):
        return call.func.id, call.args[0].id
    return None


def _checks(body: list[ast.stmt], parameter: str, entry: str) -> list[Call] | None:
    calls = []
    for statement in body:
        if _is_inert(statement):
            continue
        if not isinstance(statement, ast.Assert):
            return None
        test = statement.test
        if isinstance(test, ast.Constant) and test.value is True:
            continue  # HumanEval's "assert True, 'This prints if this assert fails'"
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and
                isinstance(test.ops[0], ast.Eq) and isinstance(test.left, ast.Call)):
            return None
        call = test.left
        if not (isinstance(call.func, ast.Name) and call.func.id == parameter):
            return None
        args = [_literal(a) for a in call.args]
        kwargs = {k.arg: _literal(k.value) for k in call.keywords if k.arg is not None}
        expected = _literal(test.comparators[0])
        if (len(kwargs) != len(call.keywords) or not all(ok for ok, _ in args) or
                not all(ok for ok, _ in kwargs.values()) or not expected[0] or
                any(isinstance(a, ast.Starred) for a in call.args)):
            return None
        calls.append(Call(entry, tuple(v for _, v in args),
                          {k: v for k, (_, v) in kwargs.items()}, expected[1]))
    return calls


def _literal(node: ast.expr) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def remote_names(program: str, question: str) -> list[str]:
    """The names the tests reach in the completion's process: the functions the question
    leaves for the completion to write (its stubs). Every other name the tests use resolves in
    the tests process, from the question's own text or the builtins, so a completion that
    defines ``abs``, ``len`` or a helper of the question cannot change what the tests compute.
    Without stubs (a bare ``run_tests``), every top-level name of the program but builtins and
    the question's own names."""
    own = _bound(ast.parse(program))
    try:
        trusted = ast.parse(question)
    except (SyntaxError, ValueError):
        trusted = ast.parse("")
    stubs = {n.name for n in trusted.body if _is_stub(n)}
    if stubs:
        return sorted(stubs & own)
    return sorted(own - _bound(trusted) - set(dir(builtins)))


def _bound(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names
                         if a.name != "*")
    return names


def _is_stub(node: ast.stmt) -> TypeGuard[ast.FunctionDef | ast.AsyncFunctionDef]:
    """A function the completion must write: its body is only a docstring, pass or ``...``."""
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and all(
        _is_inert(s) for s in node.body)


__all__ = ["Call", "call_plan", "remote_names"]
