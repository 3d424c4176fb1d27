"""The privacy journal: a durable, append-only record of every charged round (invariant 5).

The trainer charges a round *before* the round touches data: one line is appended and
fsynced to each of two independent files, ``recovery/journal.jsonl`` and its twin
``recovery/journal-twin.jsonl``. Rounds after the newest checkpoint are proven by nothing
else, so one file would be a single point of failure: with two, the loss or damage of any one
file (alone, or with ``ledger.json`` and the certificate) loses no charged round, because
:meth:`PrivacyJournal.open` takes the larger count (issue 32). Each line is a JSON object

    {"seq": 7, "kind": "charge", "round": 6, "count": 1, "total": 7,
     "sampling_rate": q, "noise_multiplier": sigma, "sha256": "..."}

``seq`` is the line's number (1, 2, ...), ``count`` the rounds this line charges, ``total`` the
rounds charged by the journal up to and including it, and ``sha256`` the digest of the line's
canonical JSON without that field. Kinds: ``charge`` (one round), ``recovered`` (rounds that
other records prove were charged but whose lines were lost; see :mod:`dpgrpo.rundir.resume`) and
``torn`` (a note, count 0, after a torn line that has been charged).

Reading never under-counts. Every line that is not an intact record (torn by a crash, or
garbage) charges one round at the run's (q, sigma), as does each checksum-less line of the
first journal format; the journal's count is the larger of the sum of all line counts and the
largest ``total`` of an intact line plus the damaged lines after it. Lost middle lines are thus
covered by later totals, interleaved writers by the sum, and a torn last line is charged, never
dropped. The journal of one run has one (q, sigma); a line with other values is a contradiction
(:class:`~dpgrpo.errors.LedgerError`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpgrpo.config.durable import fsync_dir
from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DiskFullError, LedgerError
from dpgrpo.privacy.accounting import PrivacyLedger

KINDS = ("charge", "recovered", "torn")


def _digest(record: Mapping[str, object]) -> str:
    body = {k: v for k, v in record.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_line(record: Mapping[str, object]) -> bytes:
    """One journal line (with its checksum and the final newline)."""
    record = {**record, "sha256": _digest(record)}
    return (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode_line(raw: bytes) -> JSON | None:
    """The record on one line, or None if it is torn, garbage or fails its checksum."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("sha256") != _digest(record):
        return None
    ok = (record.get("kind") in KINDS and all(isinstance(record.get(k), int)
                                              for k in ("seq", "count", "total"))
          and all(isinstance(record.get(k), (int, float))
                  for k in ("sampling_rate", "noise_multiplier")))
    return record if ok else None


@dataclass
class JournalScan:
    """What a journal file proves: rounds charged, and the lines that were not intact."""

    rounds: int = 0
    lines: int = 0            # lines, the torn tail included
    damaged: list[int] = field(default_factory=list)   # 1-based numbers of damaged lines
    repaired: list[int] = field(default_factory=list)  # torn lines an earlier open() noted
    torn_tail: bool = False   # the file does not end with a newline (a write cut short)
    last_seq: int = 0


def scan(path: Path, sampling_rate: float, noise_multiplier: float) -> JournalScan:
    """Read ``path`` (missing: nothing charged) and count its rounds, never under-counting."""
    out = JournalScan()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return out
    chunks = raw.split(b"\n")
    out.torn_tail = chunks[-1] != b""
    if not out.torn_tail:
        chunks.pop()
    summed = running = 0
    for number, chunk in enumerate(chunks, start=1):
        record = decode_line(chunk)
        legacy = _legacy_line(chunk) if record is None else None
        if legacy is not None:  # written before lines had checksums: one round each
            _check_parameters(legacy, path, number, sampling_rate, noise_multiplier)
            summed, running = summed + 1, running + 1
            continue
        if record is None:
            out.damaged.append(number)
            summed, running = summed + 1, running + 1
            continue
        _check_parameters(record, path, number, sampling_rate, noise_multiplier)
        if record["kind"] == "torn" and out.damaged and out.damaged[-1] == number - 1:
            out.repaired.append(out.damaged.pop())  # charged and noted by an earlier repair
        summed += record["count"]
        running = max(running, record["total"])
        out.last_seq = max(out.last_seq, record["seq"])
    out.lines, out.rounds = len(chunks), max(summed, running)
    return out


def _legacy_line(raw: bytes) -> JSON | None:
    """A charge line written before lines had checksums: round, sampling_rate, noise_multiplier."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or set(record) != {"round", "sampling_rate",
                                                       "noise_multiplier"}:
        return None
    return record


def _check_parameters(record: Mapping[str, object], path: Path, number: int, q: float,
                      sigma: float) -> None:
    if (record["sampling_rate"], record["noise_multiplier"]) != (q, sigma):
        raise LedgerError(
            f"{path}, line {number}: charged at q = {record['sampling_rate']}, sigma = "
            f"{record['noise_multiplier']} but the run's config gives q = {q}, sigma = {sigma}; "
            "the run's privacy records contradict each other, so it cannot be resumed")


class _JournalFile:
    """One journal file: its scan, its own line numbers and the rounds it charges."""

    def __init__(self, path: Path, sampling_rate: float, noise_multiplier: float) -> None:
        self.path = Path(path)
        self.sampling_rate, self.noise_multiplier = sampling_rate, noise_multiplier
        self.rounds = 0
        self._seq = 0
        self.found = JournalScan()

    def open(self) -> JournalScan:
        self.found = scan(self.path, self.sampling_rate, self.noise_multiplier)
        self.rounds, self._seq = self.found.rounds, max(self.found.lines, self.found.last_seq)
        if self.found.torn_tail:
            self._append(b"\n")  # the torn line ends here; later lines cannot glue onto it
            self.write("torn", round_index=-1, count=0,
                       note=f"line {self.found.lines} was torn by a crash; charged as one round")
        return self.found

    def write(self, kind: str, *, round_index: int, count: int, note: str | None = None) -> None:
        record: dict[str, object] = {
            "seq": self._seq + 1, "kind": kind, "round": round_index, "count": count,
            "total": self.rounds + count, "sampling_rate": self.sampling_rate,
            "noise_multiplier": self.noise_multiplier}
        if note is not None:
            record["note"] = note
        self._append(encode_line(record))
        self._seq += 1
        self.rounds += count

    def _append(self, data: bytes) -> None:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                fsync_dir(self.path.parent)  # the new file's name (its folder's entry)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"disk full: could not append to the privacy journal "
                                    f"{self.path}; free space, then resume the run") from None
            raise


class PrivacyJournal:
    """The journal of one run, with that run's public (q, sigma), kept in two files.

    ``path`` and ``twin`` are independent files (two inodes) holding the same charges; every
    line is appended and fsynced to both before :meth:`charge` returns, so a round that
    touches data is durable twice, and cutting, deleting, garbling or rolling back either
    file (alone, or with the ledger and the certificate) cannot lose it. :meth:`open` scans
    both, repairs a torn last line in each (a newline and a ``torn`` note are appended; the
    torn line stays and is charged), takes the maximum, and brings the file that charges
    fewer rounds up to it with one ``recovered`` line naming the other (:attr:`notes`). Then
    :meth:`charge` and :meth:`record_recovered` append to both; :attr:`rounds` is the count.
    ``twin=None`` keeps a single file (unit tests of the line format only).
    """

    def __init__(self, path: Path, sampling_rate: float, noise_multiplier: float,
                 twin: Path | None = None) -> None:
        self.path = Path(path)
        self.twin = None if twin is None else Path(twin)
        self.sampling_rate, self.noise_multiplier = sampling_rate, noise_multiplier
        self._files = [_JournalFile(p, sampling_rate, noise_multiplier)
                       for p in (self.path, self.twin) if p is not None]
        self.rounds = 0
        self.notes: list[str] = []

    @property
    def found(self) -> JournalScan:
        """The primary file's scan at :meth:`open`."""
        return self._files[0].found

    @property
    def scans(self) -> dict[Path, JournalScan]:
        """Each file's scan at :meth:`open` (damaged and repaired lines per file)."""
        return {f.path: f.found for f in self._files}

    def open(self) -> JournalScan:
        """Scan both files, repair torn last lines, and bring both to the larger count."""
        for file in self._files:
            file.open()
        self.rounds = max(f.rounds for f in self._files)
        self.notes = []
        for file in self._files:
            missing = self.rounds - file.rounds
            if missing > 0:
                other = max(self._files, key=lambda f: f.rounds).path
                note = (f"{missing} charged rounds are missing from {file.path.name} "
                        f"({file.rounds} there, {self.rounds} in {other.name}); charged again")
                file.write("recovered", round_index=-1, count=missing, note=note)
                self.notes.append(f"{file.path}: {note}")
        return self.found

    def charge(self, round_index: int, sampling_rate: float | None = None,
               noise_multiplier: float | None = None) -> None:
        """Charge one round before it touches data (appended and fsynced to both files)."""
        for given, own in ((sampling_rate, self.sampling_rate),
                           (noise_multiplier, self.noise_multiplier)):
            if given is not None and given != own:
                raise LedgerError(f"round {round_index} charged at {given}, the run's value is "
                                  f"{own}: one run has one (q, sigma)")
        self._write("charge", round_index=round_index, count=1)

    def record_recovered(self, count: int, round_index: int, note: str) -> None:
        """Charge ``count`` rounds that other records prove were charged (lost journal lines)."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._write("recovered", round_index=round_index, count=count, note=note)

    def ledger(self) -> PrivacyLedger:
        """The rounds charged so far as a ledger of the run's (q, sigma)."""
        ledger = PrivacyLedger()
        if self.rounds:
            ledger.record(self.sampling_rate, self.noise_multiplier, self.rounds)
        return ledger

    def _write(self, kind: str, *, round_index: int, count: int, note: str | None = None) -> None:
        for file in self._files:  # each fsynced before the next: never both half-written
            file.write(kind, round_index=round_index, count=count, note=note)
        self.rounds += count


__all__ = ["JournalScan", "PrivacyJournal", "decode_line", "encode_line", "scan"]
