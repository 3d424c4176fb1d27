"""Where a split's records come from: a local file or a Hugging Face dataset split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpgrpo.errors import ConfigError, EmptyDataError
from dpgrpo.tasks.base import LoadedSplit, Problem
from dpgrpo.tasks.records import (
    MAX_RECORD_BYTES,
    RawRecord,
    Row,
    build_problems,
    read_hub,
    read_json_array,
    read_jsonl,
    resolve_dir,
)


@dataclass(frozen=True)
class Source:
    """One split's records: ``folder/filename`` locally, ``dataset[config]/splits`` on the hub.

    ``parse(row, index)`` turns one record into a :class:`Problem`; ``index`` is the record's
    0-based position in its file (positional ids stay stable across runs).
    """

    folder: str
    filename: str
    hub_dataset: str
    hub_config: str | None
    hub_splits: tuple[str, ...]
    parse: Callable[[Row, str], Problem]

    def records(self, data_dir: str | Path | None,
                source: str) -> list[tuple[str, list[RawRecord]]]:
        """``[(path label, records)]`` for this split (one entry per file or hub split)."""
        if source == "hub":
            return [(label, list(rows)) for label, rows in
                    (read_hub(self.hub_dataset, self.hub_config, s) for s in self.hub_splits)]
        if data_dir is None:
            raise ConfigError(f"{self.folder}: pass the folder holding the benchmark files")
        path = resolve_dir(data_dir, self.folder, self.filename) / self.filename
        reader = read_json_array if path.suffix == ".json" else read_jsonl
        return [(str(path), list(reader(path, MAX_RECORD_BYTES)))]

    def load(self, data_dir: str | Path | None, *, skip_invalid: bool = False,
             source: str = "local") -> LoadedSplit:
        """Build the problems of this split (errors located by file, line and field)."""
        seen: set[str] = set()
        parts: list[LoadedSplit] = []
        offset = 0
        for label, records in self.records(data_dir, source):
            if not records:
                raise EmptyDataError("holds no records (an empty file)", path=label)
            position = {line: f"{offset + i:05d}" for i, (line, _) in enumerate(records)}
            offset += len(records)

            def parse(row: Row, position: dict[int, str] = position) -> Problem:
                return self.parse(row, position[row.line])

            parts.append(build_problems(records, label, parse, skip_invalid=skip_invalid,
                                        seen=seen))
        return LoadedSplit([p for part in parts for p in part.problems],
                           tuple(s for part in parts for s in part.skipped))

