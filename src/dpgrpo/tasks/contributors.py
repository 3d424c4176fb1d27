"""Who contributed each problem: the data side of contributor-level DP.

A problem's contributor comes from ``data.contributors``, a mapping file from problem id to
contributor id, when one is given (it then decides for every problem), else from the
problem's own ``contributor`` field in the data file (:func:`dpgrpo.tasks.records.build_problems`
reads it). The mapping file is

* ``.jsonl``: one object per line, ``{"id": "gsm8k-train-00017", "contributor": "alice"}``;
* ``.csv``: a header row naming the columns ``id`` and ``contributor``, then one row per problem.

Ids of other splits may appear in the mapping (they are not used). A problem of the split with
no contributor, an empty id, or an id mapped twice is an error naming the file, line and field.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.privacy.contributors import Contributor, contributor_slot_count
from dpgrpo.privacy.sampling import SlotCount
from dpgrpo.tasks.base import LoadedSplit, Problem

if TYPE_CHECKING:
    from dpgrpo.config.json_types import JSONValue
    from dpgrpo.config.schema import DataConfig
    from dpgrpo.tasks.base import Task

MAPPING_FIELDS = ("id", "contributor")


def _rows(path: Path) -> Iterator[tuple[int, JSONValue]]:
    """``(line, object)`` of a .jsonl or .csv mapping; undecodable input raises DataError."""
    if not path.is_file():
        raise DataError("contributor mapping file not found", path=str(path))
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"undecodable bytes (not UTF-8) at byte {err.start}",
                        path=str(path)) from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        missing = [f for f in MAPPING_FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"the header must name the columns {', '.join(MAPPING_FIELDS)}",
                            path=str(path), line=1, field=missing[0])
        for row in reader:
            yield reader.line_num, row
        return
    if path.suffix.lower() != ".jsonl":
        raise DataError("a contributor mapping is a .jsonl or .csv file", path=str(path))
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"invalid JSON ({err.msg}, column {err.colno})",
                                path=str(path), line=number) from None


def _text(obj: object, field: str, path: Path, line: int) -> str:
    if not isinstance(obj, dict):
        raise DataError(f"expected an object, got {type(obj).__name__}", path=str(path), line=line)
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise DataError("expected a nonempty string or integer", path=str(path), line=line,
                        field=field)
    return str(value).strip()


def read_contributor_map(path: str | Path) -> dict[str, str]:
    """Problem id -> contributor id from a ``.jsonl`` or ``.csv`` mapping file."""
    path = Path(path).expanduser()
    mapping: dict[str, str] = {}
    for line, obj in _rows(path):
        problem_id = _text(obj, "id", path, line)
        contributor = _text(obj, "contributor", path, line)
        if problem_id in mapping and mapping[problem_id] != contributor:
            raise DataError(f"problem {problem_id!r} is mapped to two contributors",
                            path=str(path), line=line, field="id")
        mapping[problem_id] = contributor
    return mapping


def assign_contributors(problems: Sequence[Problem], mapping: dict[str, str] | None, *,
                        source: str) -> list[Problem]:
    """``problems`` with ``contributor`` set from ``mapping`` (when given) or kept from their own
    field; a problem left without one is a DataError (``source`` names the file to fix)."""
    out = []
    for problem in problems:
        who = mapping.get(problem.id) if mapping is not None else problem.contributor
        if who is None:
            raise DataError(f"problem {problem.id!r} has no contributor: give every problem a "
                            "`contributor` field or map its id in data.contributors",
                            path=source, field="contributor")
        out.append(problem if who == problem.contributor else replace(problem, contributor=who))
    return out


def group_by_contributor(problems: Iterable[Problem]) -> list[tuple[str, list[Problem]]]:
    """``(contributor, its problems)`` in order of first appearance, problems in file order."""
    groups: dict[str, list[Problem]] = {}
    for problem in problems:
        if problem.contributor is None:
            raise DataError(f"problem {problem.id!r} has no contributor", field="contributor")
        groups.setdefault(problem.contributor, []).append(problem)
    return list(groups.items())


def contributor_slots(data: DataConfig, task: Task, loaded: LoadedSplit,
                      canaries: int) -> tuple[list[Contributor | None], SlotCount]:
    """The contributor slots of a split (before the canaries): its contributors, in order of
    first appearance, then absent slots up to ``data.n_slots`` - canaries (the count:
    :func:`dpgrpo.privacy.contributors.contributor_slot_count`)."""
    if data.n_slots is None:  # before the mapping is read (DataConfig refuses it too)
        contributor_slot_count(n_slots=None, contributors=0, canaries=canaries)
    if data.limit is not None:
        raise ConfigError("data.limit is refused with data.privacy_unit = 'contributor' "
                          "(a cut before grouping couples contributors)")
    mapping = read_contributor_map(data.contributors) if data.contributors else None
    source = data.contributors or f"the {task.name} {data.split} split"
    groups = group_by_contributor(assign_contributors(loaded.problems, mapping, source=source))
    count = contributor_slot_count(n_slots=data.n_slots, contributors=len(groups),
                                   canaries=canaries)
    slots: list[Contributor | None] = [
        Contributor(who, tuple((task, p) for p in owned)) for who, owned in groups]
    return slots + [None] * (count.n - canaries - len(slots)), count


__all__ = ["MAPPING_FIELDS", "assign_contributors", "contributor_slots", "group_by_contributor",
           "read_contributor_map"]
