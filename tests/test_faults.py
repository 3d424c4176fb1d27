"""Fault injection on the tiny model: kill -9 at each phase of a round and of a checkpoint,
then resume. The ledger never under-counts, release/ always matches the newest checkpoint,
and nothing half-written survives (docs/faults.md lists every case and its outcome)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import dpgrpo.checkpoint as checkpoint
import dpgrpo.privacy.journal as journal_module
import dpgrpo.trainer as trainer
from dpgrpo.checkpoint import RELEASE_FILES
from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.privacy.journal import scan
from dpgrpo.privacy.sampling import PoissonSampler
from faultkit import KILLED, die, kill_on_call, run_in_child

Q, SIGMA = 0.1, 1.0


def _memoized(fn):
    import functools

    cached = functools.lru_cache(maxsize=None)(fn)

    def call(events, delta, *args, **kwargs):
        return cached(tuple(events), delta, *args, **kwargs)

    return call


_ORIGINAL = {}


@pytest.fixture(autouse=True)
def memoized_accountant(monkeypatch):
    """Memoize the (pure, deterministic) accountant for the tests here: every run certifies
    the same few ledgers, and one PLD evaluation takes about a second on one core. Forked
    children inherit the parent's memo."""
    from dpgrpo.privacy import accounting

    for name in ("pld_epsilon", "rdp_epsilon"):
        if name not in _ORIGINAL:
            _ORIGINAL[name] = (getattr(accounting, name), _memoized(getattr(accounting, name)))
        monkeypatch.setattr(accounting, name, _ORIGINAL[name][1])


def tiny_config(model_dir, *extra: str):
    base = [f"model.name={model_dir}", "model.device=cpu", "data.limit=40",
            "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.steps=4",
            "train.group_size=2", "train.max_new_tokens=4", "train.checkpoint_every=2"]
    return apply_overrides(embedded_default(), base + list(extra))


def eps(rounds: int) -> float:
    return compute_epsilon(40, 4, rounds, SIGMA, 1 / 400).epsilon


def certificate(run_dir) -> dict:
    return json.loads((run_dir / "release" / "certificate.json").read_text())


def assert_consistent(run_dir, charged: int, retained: int = 4) -> None:
    """The run after a resume: journal, ledger.json and certificate agree and nothing stray."""
    cert = certificate(run_dir)
    assert (cert["rounds_charged"], cert["rounds_retained"]) == (charged, retained)
    assert cert["epsilon"] == pytest.approx(eps(charged), rel=1e-12)
    assert scan(run_dir / "recovery" / "journal.jsonl", Q, SIGMA).rounds == charged
    ledger = json.loads((run_dir / "recovery" / "ledger.json").read_text())
    assert sum(e["count"] for e in ledger["events"]) == charged
    assert {p.name for p in (run_dir / "release").iterdir()} <= RELEASE_FILES
    leftovers = [p.name for p in [*run_dir.iterdir(), *(run_dir / "recovery").iterdir()]
                 if p.name.startswith(".")]
    assert leftovers == []
    newest = checkpoint.load_checkpoint(run_dir / "recovery")
    assert newest.round_done == retained
    released = _released_adapter(run_dir)
    assert all(torch.equal(released[k], v) for k, v in _peft_names(newest.state["adapter"]).items())


def _released_adapter(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "release" / "adapter_model.safetensors"))


def _peft_names(adapter: dict) -> dict:
    """Recovery keys (``...lora_A.default.weight``) as PEFT saves them (no adapter name)."""
    return {k.replace(".default", ""): v for k, v in adapter.items()}


def kill_during(point: str) -> None:
    """Patch one phase of the loop (in the child) so that the process dies there."""
    latest_4 = lambda path, text: path.name == "latest" and "step-000004" in text  # noqa: E731
    aside = lambda src, dst, *a, **k: str(dst).endswith(".release-old")  # noqa: E731
    phases = {
        # a round: charged but not started; coins drawn; after the noisy AdamW step
        "charged": lambda: kill_on_call(trainer.PrivacyJournal, "charge", 3, when="after"),
        "sampled": lambda: kill_on_call(PoissonSampler, "sample", 3, when="after"),
        "stepped": lambda: kill_on_call(trainer, "_apply", 4, when="after"),
        # the round-4 checkpoint: state.pt half written; the step folder in place but `latest`
        # not moved; `latest` moved but neither telemetry nor release written; the release
        # built but not swapped in; the old release moved aside, the new one not yet in place
        "state-half-written": lambda: _half_written(checkpoint.torch, "save", 2),
        "before-latest": lambda: kill_on_call(checkpoint, "atomic_write_text", 1, match=latest_4),
        "before-release": lambda: kill_on_call(trainer, "append_lines", 2),
        "release-built": lambda: kill_on_call(checkpoint, "_build_release", 2, when="after"),
        "release-moved-aside": lambda: kill_on_call(checkpoint.os, "replace", 1, when="after",
                                                    match=aside),
        # the journal: the third charge line torn mid-write
        "journal-torn": lambda: _torn_journal_write(3),
    }
    phases[point]()


def _half_written(owner, name: str, nth: int) -> None:
    """The nth ``torch.save`` leaves half of its file behind and the process dies."""
    original, calls = getattr(owner, name), [0]

    def half(obj, path, *args, **kwargs):
        calls[0] += 1
        original(obj, path, *args, **kwargs)
        if calls[0] == nth:
            data = open(path, "rb").read()
            open(path, "wb").write(data[: len(data) // 2])
            die()

    setattr(owner, name, half)


def _torn_journal_write(nth: int) -> None:
    """The nth charge line is written half, then the process dies."""
    original, calls = journal_module.os.write, [0]

    def torn(fd, data):
        if b'"kind":"charge"' in bytes(data):
            calls[0] += 1
            if calls[0] == nth:
                original(fd, bytes(data)[: len(data) // 2])
                die()
        return original(fd, data)

    journal_module.os.write = torn


def _release_rounds(run_dir) -> int | None:
    path = run_dir / "release" / "certificate.json"
    return json.loads(path.read_text())["rounds_retained"] if path.exists() else None


def _temporaries(run_dir) -> list[str]:
    return sorted(p.name for p in [*run_dir.iterdir(), *(run_dir / "recovery").iterdir()]
                  if p.name.startswith(".") and p.name != ".lock")


# (kill point, what the kill left behind, rounds charged after the resume). Rounds 1-2 are
# checkpointed at round 2; a kill after that replays rounds 3-4 and charges them twice.
CASES = [
    ("charged", lambda d: _release_rounds(d) == 2, 5),
    ("sampled", lambda d: _release_rounds(d) == 2, 5),
    ("stepped", lambda d: _release_rounds(d) == 2, 6),
    ("state-half-written", lambda d: any(n.startswith(".step-") for n in _temporaries(d)), 6),
    ("before-latest", lambda d: (d / "recovery" / "latest").read_text() == "step-000002\n"
     and (d / "recovery" / "step-000004").is_dir(), 4),
    ("before-release", lambda d: (d / "recovery" / "latest").read_text() == "step-000004\n"
     and _release_rounds(d) == 2, 4),  # the stale final release of issue 16
    ("release-built", lambda d: any(n.startswith(".release-") for n in _temporaries(d))
     and _release_rounds(d) == 2, 4),
    ("release-moved-aside", lambda d: not (d / "release").exists(), 4),
    ("journal-torn", lambda d: not (d / "recovery" / "journal.jsonl").read_bytes().endswith(b"\n"),
     5),
]


@pytest.mark.parametrize("point, left, charged", CASES, ids=[c[0] for c in CASES])
def test_kill_then_resume(tiny_model_dir, tmp_path, point, left, charged):
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir)

    def child():
        kill_during(point)
        trainer.train(cfg, run_dir)

    assert run_in_child(child) == KILLED
    assert left(run_dir)
    journal_before = scan(run_dir / "recovery" / "journal.jsonl", Q, SIGMA).rounds
    result = trainer.train(None, run_dir, resume=True)
    assert result.rounds_done == 4
    assert_consistent(run_dir, charged)
    assert charged >= journal_before
    # A second resume finds a finished, consistent run and changes nothing.
    before = {p: p.read_bytes() for p in (run_dir / "recovery").glob("*.json*")}
    again = trainer.train(None, run_dir, resume=True)
    assert again.certificate == certificate(run_dir) and again.notes == ()
    assert before == {p: p.read_bytes() for p in (run_dir / "recovery").glob("*.json*")}


# --- damaged recovery files --------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A finished 4-round run (checkpoints at rounds 2 and 4), copied by each test."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    trainer.train(tiny_config(tiny_model_dir), run_dir)
    return run_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    import shutil

    return shutil.copytree(finished_run, tmp_path / "run")


def _journal_lines(run_dir) -> list[bytes]:
    return (run_dir / "recovery" / "journal.jsonl").read_bytes().splitlines(keepends=True)


def test_lost_journal_tail_never_certifies_less(run_dir):
    """Issue 16: journal cut to 2 lines, newest checkpoint gone, latest -> step-000002.
    Before the fix: rounds_charged 2 < rounds_retained 4 and a smaller epsilon."""
    import shutil

    journal = run_dir / "recovery" / "journal.jsonl"
    journal.write_bytes(b"".join(_journal_lines(run_dir)[:2]))
    shutil.rmtree(run_dir / "recovery" / "step-000004")
    (run_dir / "recovery" / "latest").write_text("step-000002\n")
    result = trainer.train(None, run_dir, resume=True)
    # 4 rounds proven by ledger.json and the release, then rounds 3-4 replayed: 6.
    assert_consistent(run_dir, 6)
    assert any("2 charged rounds are missing from the journal" in n for n in result.notes)


def test_deleted_journal_never_certifies_less(run_dir):
    (run_dir / "recovery" / "journal.jsonl").unlink()
    result = trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 4)  # proven by step-000004, ledger.json and the release
    assert any("4 charged rounds" in n for n in result.notes)


def test_truncated_newest_checkpoint_falls_back(run_dir):
    state = run_dir / "recovery" / "step-000004" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    result = trainer.train(None, run_dir, resume=True)
    assert any("step-000004/state.pt" in n and "resuming from step-000002" in n
               for n in result.notes)
    assert_consistent(run_dir, 6)  # rounds 3-4 replayed and charged again


def test_every_checkpoint_damaged_is_a_one_line_error(run_dir):
    from dpgrpo.errors import RecoveryError

    for step in ("step-000002", "step-000004"):
        (run_dir / "recovery" / step / "state.pt").write_bytes(b"")
    before = (run_dir / "recovery" / "journal.jsonl").read_bytes()
    with pytest.raises(RecoveryError, match="no intact checkpoint") as err:
        trainer.train(None, run_dir, resume=True)
    assert "step-000002/state.pt" in str(err.value) and "\n" not in str(err.value)
    assert (run_dir / "recovery" / "journal.jsonl").read_bytes() == before


@pytest.mark.parametrize("damage, charged", [
    (lambda ls: [ls[0], b"garbage\n", *ls[2:]], 4),         # covered by later totals
    (lambda ls: [*ls, b"garbage\n"], 5),                     # charged as one more round
    (lambda ls: [*ls, ls[-1][:25]], 5),                      # a torn last line: charged
])
def test_damaged_journal_lines_are_charged(run_dir, damage, charged):
    journal = run_dir / "recovery" / "journal.jsonl"
    journal.write_bytes(b"".join(damage(_journal_lines(run_dir))))
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, charged)
    assert journal.read_bytes().endswith(b"\n")  # repaired: later lines cannot glue on


def test_garbage_config_falls_back_to_its_toml_twin(run_dir):
    from dpgrpo.errors import RecoveryError

    (run_dir / "recovery" / "config.json").write_text("{garbage")
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 4)
    (run_dir / "recovery" / "config.toml").write_text("[train\n")
    with pytest.raises(RecoveryError, match="config.json is damaged.*config.toml is damaged"):
        trainer.train(None, run_dir, resume=True)


def test_contradicting_records_stop_the_resume(run_dir):
    from dpgrpo.errors import LedgerError

    ledger = run_dir / "recovery" / "ledger.json"
    data = json.loads(ledger.read_text())
    data["events"][0]["noise_multiplier"] = 2.0
    ledger.write_text(json.dumps(data))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(LedgerError, match="contradict"):
        trainer.train(None, run_dir, resume=True)
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_leftover_temporaries_are_removed(run_dir):
    (run_dir / ".release-abc").mkdir()
    (run_dir / "recovery" / ".step-xyz").mkdir()
    (run_dir / "recovery" / ".tmp-ledger.json-123").write_text("{")
    result = trainer.train(None, run_dir, resume=True)
    assert result.rounds_done == 4
    assert _temporaries(run_dir) == []


def test_full_disk_names_the_place_and_keeps_no_half_release(tiny_model_dir, tmp_path,
                                                             monkeypatch):
    from dpgrpo.errors import DiskFullError

    original = torch.save
    calls = [0]

    def full_after_first(obj, path, *args, **kwargs):  # the disk fills up after checkpoint 1
        calls[0] += 1
        return original(obj, "/dev/full" if calls[0] > 1 else path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_after_first)
    run_dir = tmp_path / "run"
    with pytest.raises(DiskFullError, match=r"disk full while writing .*step-000004"):
        trainer.train(tiny_config(tiny_model_dir), run_dir)
    assert _release_rounds(run_dir) == 2 and _temporaries(run_dir) == []
    monkeypatch.setattr(checkpoint.torch, "save", original)
    trainer.train(None, run_dir, resume=True)
    assert_consistent(run_dir, 6)


# --- one writer per run ------------------------------------------------------------------

def test_second_writer_is_refused_with_the_holders_pid(run_dir, tiny_model_dir):
    import signal
    import time

    from dpgrpo.errors import RunLockedError
    from dpgrpo.runlock import RunLock

    ready = run_dir.parent / "ready"

    def holder():  # a live writer: holds the lock until killed
        RunLock(run_dir).acquire()
        ready.write_text("1")
        time.sleep(60)

    pid = os.fork()
    if pid == 0:
        try:
            holder()
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        before = (run_dir / "recovery" / "journal.jsonl").read_bytes()
        with pytest.raises(RunLockedError, match=f"in use by another dpgrpo process \\(pid {pid}\\)"):
            trainer.train(None, run_dir, resume=True)
        with pytest.raises(RunLockedError, match=f"pid {pid}"):
            trainer.train(tiny_config(tiny_model_dir), run_dir.parent / "run")
        assert (run_dir / "recovery" / "journal.jsonl").read_bytes() == before
    finally:
        os.kill(pid, signal.SIGKILL)  # kill -9: the lock dies with its holder
        os.waitpid(pid, 0)
    assert trainer.train(None, run_dir, resume=True).rounds_done == 4
    assert not (run_dir / ".lock").exists()


def test_the_invariant_guard_stops_an_under_count(run_dir, monkeypatch):
    """Were the reconciliation ever skipped, rounds_charged >= rounds_retained still holds:
    the resume stops before writing anything instead of certifying less."""
    from dpgrpo.errors import LedgerError

    monkeypatch.setattr(trainer, "reconcile", lambda journal, evidence, start: None)
    (run_dir / "recovery" / "journal.jsonl").unlink()
    release = (run_dir / "release" / "certificate.json").read_bytes()
    with pytest.raises(LedgerError, match="charges 0 rounds but the model retains 4"):
        trainer.train(None, run_dir, resume=True)
    assert (run_dir / "release" / "certificate.json").read_bytes() == release


def test_second_protocol_on_one_folder_is_refused(tiny_protocol_toml, tmp_path):
    from dpgrpo.errors import RunLockedError
    from dpgrpo.protocol import load_protocol_config, plan_protocol, protocol_settings, run_protocol
    from dpgrpo.runlock import RunLock

    cfg, table = load_protocol_config(tiny_protocol_toml)
    plan = plan_protocol(cfg, protocol_settings(table), tmp_path / "out")
    with RunLock(plan.out_dir):
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}.*one writer per protocol"):
            run_protocol(plan)
    assert not plan.out_dir.exists()  # the refused start left nothing behind
