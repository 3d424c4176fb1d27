"""Resuming a run without ever under-counting its privacy ledger (invariant 5).

The journal (:mod:`dpgrpo.privacy.journal`) is the primary record of charged rounds, kept in
two independent files (``journal.jsonl`` and ``journal-twin.jsonl``, each charge fsynced to
both before the round touches data; :meth:`~dpgrpo.privacy.journal.PrivacyJournal.open` takes
the larger), so the rounds after the newest checkpoint survive the loss of either. It is not
the only record: every checkpoint stores its round and the ledger at that time
(``step-XXXXXX/meta.json`` and ``state.pt``), ``recovery/ledger.json`` and the release's
certificate repeat the ledger, and ``recovery/telemetry.jsonl`` has one row per executed round.
Each of them is a lower bound on the rounds charged. :func:`reconcile` takes the maximum of
every record that can be read; if the journal holds fewer rounds (a lost tail, a deleted
file), the missing rounds are charged at the run's (q, sigma) with one ``recovered`` line that
names the record proving them. Records that disagree with the run's (q, sigma) stop the resume
(:class:`~dpgrpo.errors.LedgerError`): a contradiction never becomes a smaller epsilon.

Only the journal proves the rounds run after the newest other record. When neither journal
file reaches that record (both lost, cut, garbled or rolled back: issue 56), :func:`reconcile`
charges the most rounds that can have run after it, :func:`most_rounds_past`: up to and
including the next checkpoint's round (a kill while that checkpoint is written leaves
``train.checkpoint_every`` rounds run past the last one), never past ``train.rounds``.

Before any certificate is written, :func:`check_charged` enforces
``rounds_charged >= rounds_retained``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dpgrpo.config import RunConfig, config_from_dict, read_toml
from dpgrpo.errors import ConfigError, DPGRPOError, LedgerError, RecoveryError
from dpgrpo.privacy.accounting import PrivacyLedger
from dpgrpo.privacy.journal import PrivacyJournal
from dpgrpo.rundir.checkpoint import Checkpoint, checkpoint_dirs
from dpgrpo.rundir.layout import RunDir, verify_release_files
from dpgrpo.rundir.migrate import as_written

log = logging.getLogger(__name__)


def read_run_config(run_dir: Path) -> RunConfig:
    """The full config saved in ``recovery/config.json`` (else ``config.toml``, its twin)."""
    json_path, toml_path = RunDir(run_dir).config_json, RunDir(run_dir).config_toml
    if not json_path.exists() and not toml_path.exists():
        raise ConfigError(f"{run_dir} is not a dpgrpo run directory (no recovery/config.json)")
    problems = []
    for path, read in ((json_path, lambda p: json.loads(p.read_text())), (toml_path, read_toml)):
        if not path.exists():
            continue
        try:
            data = read(path)
            if not isinstance(data, dict):
                raise ValueError("not a table of settings")
            config = config_from_dict(as_written(data), source=str(path))
        except (OSError, UnicodeDecodeError, ValueError, TypeError, DPGRPOError) as err:
            problems.append(f"{path} is damaged ({' '.join(str(err).split())[:160]})")
            continue
        for problem in problems:
            log.warning("%s; using %s", problem, path)
        return config
    raise RecoveryError("; ".join(problems) + ": the run's config cannot be recovered")


@dataclass(frozen=True)
class Evidence:
    """A lower bound on the rounds charged, the record it comes from, and the round the run
    had reached when that record was written (None: the record does not say)."""

    rounds: int
    source: str
    reached: int | None = None


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        log.warning("%s is damaged; it is rewritten at the next checkpoint", path)
        return None


def _ledger_rounds(data: object, source: str, q: float, sigma: float) -> int | None:
    """Rounds of a saved ledger, after checking that it was charged at (q, sigma)."""
    if not isinstance(data, dict):
        return None
    try:
        ledger = PrivacyLedger.from_dict(data)
    except (KeyError, TypeError, ValueError, DPGRPOError):
        log.warning("the ledger in %s is damaged; ignored", source)
        return None
    for event in ledger.events:
        if (event.sampling_rate, event.noise_multiplier) != (q, sigma):
            raise LedgerError(f"{source} charged rounds at q = {event.sampling_rate}, sigma = "
                              f"{event.noise_multiplier} but the run's config gives q = {q}, "
                              f"sigma = {sigma}: the run's privacy records contradict each other")
    return ledger.rounds


def gather_evidence(run_dir: Path, q: float, sigma: float,
                    restored: Checkpoint | None) -> list[Evidence]:
    """Every record besides the journal that bounds the rounds charged from below."""
    recovery, found = RunDir(run_dir).recovery, []

    def add(rounds: object, source: str, reached: object = None) -> None:
        if isinstance(rounds, int) and rounds > 0:
            found.append(Evidence(rounds, source, reached if isinstance(reached, int) else None))

    for step in checkpoint_dirs(recovery):
        meta = _json(step / "meta.json")
        if isinstance(meta, dict):
            done = meta.get("round_done")
            add(done, f"{step.name} (round reached)", done)
            add(_ledger_rounds(meta.get("ledger"), str(step / "meta.json"), q, sigma),
                f"{step.name} (its ledger)", done)
    if restored is not None:
        done = restored.round_done
        add(done, f"{restored.path.name} (round reached)", done)
        add(_ledger_rounds(restored.state.get("ledger"), str(restored.path / "state.pt"), q,
                           sigma), f"{restored.path.name}/state.pt (its ledger)", done)
    cert = _json(RunDir(run_dir).certificate_path)
    cert = cert if isinstance(cert, dict) else {}
    if {"q", "sigma"} <= cert.keys() and (cert["q"], cert["sigma"]) != (q, sigma):
        raise LedgerError(f"{run_dir / 'release' / 'certificate.json'} certifies q = "
                          f"{cert.get('q')}, sigma = {cert.get('sigma')} but the run's config "
                          f"gives q = {q}, sigma = {sigma}: the run's records contradict "
                          "each other")
    retained = cert.get("rounds_retained")
    add(cert.get("rounds_charged"), "release/certificate.json (rounds_charged)", retained)
    add(retained, "release/certificate.json (rounds_retained)", retained)
    ledger = _ledger_rounds(_json(recovery / "ledger.json"), str(recovery / "ledger.json"), q,
                            sigma)  # written with the certificate: its round when they agree
    add(ledger, "recovery/ledger.json", retained if ledger == cert.get("rounds_charged") else None)
    add(*_telemetry_rows(recovery / "telemetry.jsonl"))
    return found


def _telemetry_rows(path: Path) -> tuple[int, str, int | None]:
    """Rows of executed rounds (each executed round adds one row at its checkpoint), the
    source, and the newest row's round (the checkpoint that wrote it)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0, "", None
    rows, newest = 0, None
    for line in raw.splitlines():
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(row, dict):
            rows += 1
            if isinstance(row.get("round"), int):
                newest = max(row["round"], newest or 0)
    return rows, "recovery/telemetry.jsonl (rows)", newest


def most_rounds_past(reached: int, checkpoint_every: int, rounds: int) -> int:
    """The most rounds that can have touched data after a record written at round ``reached``
    with no newer checkpoint: every round up to and including the next checkpoint's (a kill
    while it is written), none past ``train.rounds`` (T)."""
    if reached >= rounds:
        return 0
    return min((reached // checkpoint_every + 1) * checkpoint_every, rounds) - reached


def reconcile(journal: PrivacyJournal, evidence: list[Evidence], next_round: int, *,
              checkpoint_every: int, rounds: int) -> str | None:
    """Charge rounds that other records prove but the journal lacks; return a note if any.

    A journal that charges fewer rounds than the best other record (or nothing, with no other
    record) has lost its tail: it cannot say how many rounds ran after that record, so the
    most that can have run, :func:`most_rounds_past` of the round the record was written at,
    is charged on top (the earliest such round where records tie; ``next_round`` where a
    record does not say). Charging more never lowers epsilon; charging less could.
    """
    best = max(evidence, key=lambda e: e.rounds, default=Evidence(0, "no other record", 0))
    if journal.rounds >= best.rounds and journal.rounds > 0:
        return None                                   # the journal proves every round run
    tied = [e for e in evidence if e.rounds == best.rounds] or [best]
    reached = min(next_round if e.reached is None else e.reached for e in tied)
    past = most_rounds_past(reached, checkpoint_every, rounds)
    missing = best.rounds + past - journal.rounds
    if missing <= 0:
        return None
    worst = ("" if past == 0 else
             f"; neither journal file proves how many rounds ran after round {reached}, so "
             f"the most that can have run is charged: {past} (train.checkpoint_every = "
             f"{checkpoint_every}, train.rounds = {rounds})")
    note = (f"{missing} charged rounds are missing from the journal ({journal.rounds} there, "
            f"{best.rounds} proven by {best.source}{worst}); charged again at the run's "
            "(q, sigma)")
    journal.record_recovered(missing, next_round, note)
    return note


def check_charged(rounds_charged: int, rounds_retained: int, where: str) -> None:
    """The invariant ``rounds_charged >= rounds_retained``, checked before writing ``where``."""
    if rounds_charged < rounds_retained:
        raise LedgerError(f"refusing to write {where}: the ledger charges {rounds_charged} "
                          f"rounds but the model retains {rounds_retained}; the privacy "
                          "records are inconsistent and epsilon would be under-stated")


def release_is_current(run_dir: Path, round_done: int, rounds_charged: int) -> bool:
    """Whether ``release/`` holds the adapter of ``round_done`` with the current ledger."""
    layout = RunDir(run_dir)
    cert = layout.certificate()
    names = {"adapter_model.safetensors", "adapter_config.json", "dpgrpo_config.json"}
    return (cert is not None and cert.get("rounds_retained") == round_done
            and cert.get("rounds_charged") == rounds_charged
            and all((layout.release / name).is_file() for name in names)
            and _release_intact(layout.release, cert))


def _release_intact(release: Path, cert: Mapping[str, object]) -> bool:
    """Whether every release file matches the sha256 its certificate recorded (a damaged one
    is rewritten from the checkpoint by the caller, with a warning)."""
    try:
        verify_release_files(release, cert)
    except DPGRPOError as err:
        log.warning("%s", err)
        return False
    return True


__all__ = ["Evidence", "check_charged", "gather_evidence", "most_rounds_past", "read_run_config",
           "reconcile", "release_is_current"]
