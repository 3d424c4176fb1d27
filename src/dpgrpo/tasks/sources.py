"""Where a split's records come from: a local file or a Hugging Face dataset split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpgrpo.tasks.base import LoadedSplit, Problem
from dpgrpo.tasks.records import (
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

    def records(self, data_dir: str | Path | None, source: str) -> list[tuple[str, list[RawRecord]]]:
        """``[(path label, records)]`` for this split (one entry per file or hub split)."""
        if source == "hub":
            return [(label, list(rows)) for label, rows in
                    (read_hub(self.hub_dataset, self.hub_config, s) for s in self.hub_splits)]
        assert data_dir is not None
        path = resolve_dir(data_dir, self.folder, self.filename) / self.filename
        reader = read_json_array if path.suffix == ".json" else read_jsonl
        return [(str(path), list(reader(path)))]

    def load(self, data_dir: str | Path | None, *, skip_invalid: bool = False,
             source: str = "local") -> LoadedSplit:
        """Build the problems of this split (errors located by file, line and field)."""
        seen: set[str] = set()
        parts = []
        for label, records in self.records(data_dir, source):
            index = _positions(records, offset=sum(len(p.problems) + len(p.skipped)
                                                    for p in parts))
            parts.append(build_problems(
                ((line, obj) for line, obj in records), label,
                lambda row, _index=index: self.parse(row, _index[row.line]),
                skip_invalid=skip_invalid, seen=seen))
        return LoadedSplit([p for part in parts for p in part.problems],
                           tuple(s for part in parts for s in part.skipped))


def _positions(records: list[RawRecord], offset: int) -> dict[int, str]:
    """Map each record's line to its zero-padded position (the id suffix)."""
    return {line: f"{offset + i:05d}" for i, (line, _) in enumerate(records)}
