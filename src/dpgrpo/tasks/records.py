"""Reading benchmark files record by record, with the file, line and field of every error.

Nothing is dropped silently: a bad record raises :class:`~dpgrpo.errors.DataError`, or, with
``skip_invalid=True``, is skipped and returned in the list of skipped records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.tasks.base import LoadedSplit, Problem

if TYPE_CHECKING:
    from dpgrpo.config.json_types import JSONValue

#: One raw record: its line (or hub row number) and the decoded object, or why it failed.
RawRecord = tuple[int, Any]

#: Largest record of a benchmark file, in bytes (public pre-processing, like an invalid record:
#: a bigger one stops the load, or with skip_invalid is an absent slot). A prompt is a few KB;
#: a 64 MB line would be tokenized into a context no model has and stall the first round.
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class Row:
    """One decoded record with its origin, for field access with located errors."""

    data: JSONValue
    path: str
    line: int

    def error(self, message: str, field: str | None = None) -> DataError:
        return DataError(message, path=self.path, line=self.line, field=field)

    def value(self, field: str) -> JSONValue:
        if not isinstance(self.data, Mapping):
            raise self.error(f"expected a JSON object, got {type(self.data).__name__}")
        if field not in self.data or self.data[field] is None:
            raise self.error("missing field", field)
        return self.data[field]

    def text(self, field: str) -> str:
        """A required, nonempty string field."""
        value = self.value(field)
        if not isinstance(value, str):
            raise self.error(f"expected a string, got {type(value).__name__}", field)
        if not value.strip():
            raise self.error("empty", field)
        return value


def resolve_dir(data_dir: str | Path, folder: str, expected: str) -> Path:
    """The benchmark folder: ``data_dir/folder`` if it exists, else ``data_dir`` itself if it
    holds ``expected`` (so both ``../shared/data`` and ``../shared/data/gsm8k`` work)."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError("data directory not found", path=str(root))
    if (root / folder).is_dir():
        return root / folder
    if (root / expected).exists():
        return root
    raise DataError(f"neither {folder}/ nor {expected} found here", path=str(root))


def _decode(raw: bytes, path: Path, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"undecodable bytes (not UTF-8) at byte {err.start} of the line",
                        path=str(path), line=line) from None


def read_jsonl(path: Path, max_bytes: int | None = None) -> Iterator[RawRecord]:
    """Yield ``(line, object)`` per nonblank line; a bad line yields ``(line, DataError)``, and
    so does a line over ``max_bytes`` with its line ending (read in pieces, never held whole)."""
    if not path.is_file():
        raise DataError("file not found", path=str(path))
    with path.open("rb") as handle:
        for number, raw in enumerate(_lines(handle, max_bytes), start=1):
            if isinstance(raw, int):
                yield number, DataError(f"record of {raw:,} bytes, over the {max_bytes:,}-byte "
                                        "bound on one record", path=str(path), line=number)
                continue
            if not raw.strip():
                continue
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            try:
                yield number, json.loads(_decode(raw, path, number))
            except DataError as err:
                yield number, err
            except json.JSONDecodeError as err:
                yield number, DataError(f"invalid JSON ({err.msg}, column {err.colno})",
                                        path=str(path), line=number)


def _lines(handle: IO[bytes], max_bytes: int | None) -> Iterator[bytes | int]:
    """The file's lines, or for a line over ``max_bytes`` (its line ending included) its size."""
    while True:
        raw = handle.readline() if max_bytes is None else handle.readline(max_bytes + 1)
        if not raw:
            return
        if max_bytes is None or len(raw) <= max_bytes:  # shorter than the limit: a whole line
            yield raw
            continue
        size = len(raw)
        while not raw.endswith(b"\n"):  # skip the rest of the long line, 1 MiB at a time
            raw = handle.readline(1 << 20)
            if not raw:
                break
            size += len(raw)
        yield size


def read_json_array(path: Path, max_bytes: int | None = None) -> Iterator[RawRecord]:
    """Yield ``(line, object)`` for each element of a top-level JSON array (e.g. SVAMP)."""
    if not path.is_file():
        raise DataError("file not found", path=str(path))
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError("undecodable bytes (not UTF-8)", path=str(path), line=line) from None
    decoder = json.JSONDecoder()
    pos = _skip(text, 0)
    if not text.startswith("[", pos):
        raise DataError("expected a JSON array", path=str(path), line=1)
    pos = _skip(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        line = text.count("\n", 0, pos) + 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise DataError(f"invalid JSON ({err.msg})", path=str(path), line=err.lineno) from None
        too_big = max_bytes is not None and len(text[pos:end].encode("utf-8")) > max_bytes
        yield line, (DataError(f"record over the {max_bytes:,}-byte bound on one record",
                               path=str(path), line=line) if too_big else obj)
        pos = end
        pos = _skip(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def read_hub(dataset: str, config: str | None, split: str) -> tuple[str, Iterator[RawRecord]]:
    """Rows of a Hugging Face dataset split (``datasets`` is imported only here)."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("source='hub' needs the `datasets` package: "
                          "pip install 'dpgrpo[hub]'") from None
    label = f"hf://{dataset}" + (f"[{config}]" if config else "") + f"/{split}"
    rows = datasets.load_dataset(dataset, config, split=split)
    return label, ((i, dict(row)) for i, row in enumerate(rows, start=1))


def build_problems(records: Iterable[RawRecord], path: str, parse: Callable[[Row], Problem], *,
                   skip_invalid: bool, seen: set[str] | None = None) -> LoadedSplit:
    """Parse every record into a :class:`Problem`; fail (or skip) on the first bad one.

    Duplicate ids are errors too. ``seen`` carries ids across several files of one split.
    """
    seen = set() if seen is None else seen
    problems: list[Problem] = []
    skipped: list[DataError] = []
    for line, obj in records:
        try:
            if isinstance(obj, DataError):
                raise obj
            problem = _with_contributor(Row(obj, path, line), parse(Row(obj, path, line)))
            if problem.id in seen:
                raise DataError(f"duplicate id {problem.id!r}", path=path, line=line, field="id")
        except DataError as err:
            if not skip_invalid:
                raise
            skipped.append(err)
            continue
        seen.add(problem.id)
        problems.append(problem)
    return LoadedSplit(problems, tuple(skipped))


def _with_contributor(row: Row, problem: Problem) -> Problem:
    """The record's optional ``contributor`` field (a nonempty string or integer), if any."""
    if not isinstance(row.data, Mapping) or row.data.get("contributor") is None:
        return problem
    value = row.data["contributor"]
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise row.error("expected a nonempty string or integer", "contributor")
    return replace(problem, contributor=str(value).strip())


def merge(*parts: LoadedSplit, excluded: Mapping[str, int] | None = None) -> LoadedSplit:
    """Concatenate loaded parts, keeping every skipped record."""
    return LoadedSplit([p for part in parts for p in part.problems],
                       tuple(s for part in parts for s in part.skipped), dict(excluded or {}))


def normalize_text(text: str) -> str:
    """Problem text for identity matching: whitespace runs collapsed, ends stripped."""
    return " ".join(text.split())
