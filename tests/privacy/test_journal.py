"""The privacy journal: checksummed append-only lines whose count never goes down."""

from __future__ import annotations

import json

import pytest

from dpgrpo.errors import DiskFullError, LedgerError
from dpgrpo.privacy.journal import PrivacyJournal, decode_line, encode_line, scan

Q, SIGMA = 0.1, 1.0


def journal(tmp_path, *, charges: int = 0) -> PrivacyJournal:
    j = PrivacyJournal(tmp_path / "journal.jsonl", Q, SIGMA)
    j.open()
    for t in range(charges):
        j.charge(t, Q, SIGMA)
    return j


def lines(path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def test_lines_are_checksummed_and_numbered(tmp_path):
    j = journal(tmp_path, charges=3)
    records = [decode_line(raw) for raw in lines(j.path)]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert [r["total"] for r in records] == [1, 2, 3] and j.rounds == 3
    assert all(r["kind"] == "charge" and r["count"] == 1 for r in records)
    tampered = lines(j.path)[1].replace(b'"round":1', b'"round":7')
    assert decode_line(tampered) is None  # the checksum no longer matches
    assert j.ledger().rounds == 3 and j.ledger().events[0].noise_multiplier == SIGMA


def test_torn_last_line_is_charged_and_repaired(tmp_path):
    j = journal(tmp_path, charges=3)
    raw = j.path.read_bytes()
    j.path.write_bytes(raw[:-20])  # the third line cut mid-write
    assert scan(j.path, Q, SIGMA).rounds == 3  # charged, never dropped
    again = PrivacyJournal(j.path, Q, SIGMA)
    found = again.open()
    assert found.torn_tail and found.damaged == [3] and again.rounds == 3
    again.charge(3, Q, SIGMA)
    assert again.rounds == 4 and scan(j.path, Q, SIGMA).rounds == 4
    # The repair ended the torn line, so the new charge is an intact line of its own.
    tail = [decode_line(x) for x in lines(j.path)[-2:]]
    assert [t["kind"] for t in tail] == ["torn", "charge"] and tail[-1]["total"] == 4
    # Reopening repairs nothing more and counts the same.
    third = PrivacyJournal(j.path, Q, SIGMA)
    assert not third.open().torn_tail and third.rounds == 4


@pytest.mark.parametrize("damage, expected", [
    (lambda ls: [ls[0], b"garbage", *ls[2:]], 4),       # middle line: later totals cover it
    (lambda ls: [*ls, b"{not json"], 5),                  # a garbage last line charges one
    (lambda ls: [ls[0], ls[2], ls[3]], 4),               # a lost middle line: totals cover it
    (lambda ls: ls[:2], 2),                              # a lost tail: only what is there
    (lambda ls: [*ls, b""], 5),                           # even a blank line counts (never less)
])
def test_count_never_drops_below_what_the_lines_prove(tmp_path, damage, expected):
    j = journal(tmp_path, charges=4)
    j.path.write_bytes(b"\n".join(damage(lines(j.path))) + b"\n")
    assert scan(j.path, Q, SIGMA).rounds == expected


def test_interleaved_writers_are_summed(tmp_path):
    a = journal(tmp_path, charges=2)
    b = PrivacyJournal(a.path, Q, SIGMA)
    b.open()  # both believe they are the only writer (what the run lock prevents)
    a.charge(2, Q, SIGMA)
    b.charge(2, Q, SIGMA)
    assert scan(a.path, Q, SIGMA).rounds == 4  # totals say 3, but four lines charged one each


def test_recovered_rounds_count(tmp_path):
    j = journal(tmp_path, charges=2)
    j.record_recovered(4, 6, "rounds proven by the checkpoint")
    j.charge(6, Q, SIGMA)
    assert scan(j.path, Q, SIGMA).rounds == 7 and j.rounds == 7
    assert decode_line(lines(j.path)[2])["note"] == "rounds proven by the checkpoint"


def test_first_format_lines_count_one_each(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps({"round": t, "sampling_rate": Q, "noise_multiplier": SIGMA})
                            + "\n" for t in range(3)))
    j = PrivacyJournal(path, Q, SIGMA)
    found = j.open()
    assert j.rounds == 3 and found.damaged == []
    j.charge(3, Q, SIGMA)
    assert scan(path, Q, SIGMA).rounds == 4


def test_other_parameters_are_a_contradiction(tmp_path):
    j = journal(tmp_path, charges=2)
    with pytest.raises(LedgerError, match=r"line 1: charged at q = 0.1, sigma = 1.0"):
        scan(j.path, Q, 2.0)
    with pytest.raises(LedgerError, match="one run has one"):
        j.charge(2, Q, 0.5)
    assert scan(j.path, Q, SIGMA).rounds == 2


def test_missing_journal_is_empty(tmp_path):
    assert scan(tmp_path / "nothing.jsonl", Q, SIGMA).rounds == 0


def test_full_disk_is_a_clear_error(tmp_path):
    (tmp_path / "full").symlink_to("/dev/full")  # every write fails with ENOSPC
    j = PrivacyJournal(tmp_path / "full", Q, SIGMA)
    with pytest.raises(DiskFullError, match="disk full: could not append to the privacy journal"):
        j.charge(0, Q, SIGMA)
    assert j.rounds == 0


def test_encoding_is_canonical():
    line = encode_line({"seq": 1, "kind": "charge", "round": 0, "count": 1, "total": 1,
                        "sampling_rate": Q, "noise_multiplier": SIGMA})
    assert line.endswith(b"\n") and b" " not in line
    assert decode_line(line.rstrip(b"\n"))["total"] == 1


def test_every_line_is_fsynced_before_charge_returns(tmp_path, monkeypatch):
    import stat

    import dpgrpo.privacy.journal as module

    synced: list[int] = []
    real_fsync = module.os.fsync

    def fsync(fd):
        info = module.os.fstat(fd)
        if stat.S_ISREG(info.st_mode):  # the journal file (its folder is synced once, too)
            synced.append(info.st_size)
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", fsync)
    j = journal(tmp_path)
    for t in range(3):
        j.charge(t, Q, SIGMA)
        assert synced and synced[-1] == j.path.stat().st_size  # this line included
    assert len([s for s in synced if s > 0]) == 3


# --- two independent files (issue 32) ---------------------------------------------------------

def twin_journal(tmp_path, *, charges: int = 0) -> PrivacyJournal:
    j = PrivacyJournal(tmp_path / "journal.jsonl", Q, SIGMA, twin=tmp_path / "twin.jsonl")
    j.open()
    for t in range(charges):
        j.charge(t, Q, SIGMA)
    return j


def test_every_charge_is_in_both_files(tmp_path):
    j = twin_journal(tmp_path, charges=3)
    assert j.path.stat().st_ino != j.twin.stat().st_ino  # two files, not one linked twice
    assert scan(j.path, Q, SIGMA).rounds == scan(j.twin, Q, SIGMA).rounds == j.rounds == 3
    assert lines(j.path) == lines(j.twin)


@pytest.mark.parametrize("damaged", ["journal.jsonl", "twin.jsonl"])
@pytest.mark.parametrize("damage", [
    lambda p: p.unlink(),                                              # deleted
    lambda p: p.write_bytes(b"".join(p.read_bytes().splitlines(True)[:1])),  # rolled back
    lambda p: p.write_bytes(p.read_bytes()[:30]),                      # cut mid-line
    lambda p: p.write_bytes(b"\x00" * 40),                             # garbled
], ids=["delete", "rollback", "cut", "garble"])
def test_either_file_alone_keeps_every_round(tmp_path, damaged, damage):
    twin_journal(tmp_path, charges=4)
    damage(tmp_path / damaged)
    again = PrivacyJournal(tmp_path / "journal.jsonl", Q, SIGMA, twin=tmp_path / "twin.jsonl")
    again.open()
    assert again.rounds == 4                         # the larger count, never the smaller
    assert any(damaged in note for note in again.notes)   # the lagging file is named
    for path in (again.path, again.twin):            # and brought up to it
        assert scan(path, Q, SIGMA).rounds == 4
    again.charge(4, Q, SIGMA)
    assert scan(again.path, Q, SIGMA).rounds == scan(again.twin, Q, SIGMA).rounds == 5
