"""Test-only fault injection: run a function in a forked child and SIGKILL it at a chosen call.

A forked child shares the parent's imported modules (no interpreter start-up, no re-import of
torch), patches one function so that its n-th call kills the process with SIGKILL (no
``finally`` blocks, no cleanup: exactly what ``kill -9`` or a power loss leaves behind), and
runs the target. The parent then inspects the run directory and resumes it in-process.
Below: the tiny 4-round run the fault tests share and the checks made after every resume.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.privacy.accounting import compute_epsilon
from dpgrpo.privacy.journal import scan
from dpgrpo.release.files import RELEASE_FILES
from dpgrpo.rundir import checkpoint

KILLED = -signal.SIGKILL


def die() -> None:
    """SIGKILL this process now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_on_call(owner: Any, name: str, nth: int = 1, *, when: str = "before",
                 match: Callable[..., bool] | None = None) -> None:
    """Patch ``owner.name`` so that its ``nth`` matching call kills the process.

    ``when="before"`` dies before the call runs, ``"after"`` right after it returns.
    ``match(*args, **kwargs)`` selects which calls count (default: every call).
    """
    original = getattr(owner, name)
    calls = [0]

    def patched(*args: Any, **kwargs: Any) -> Any:
        if match is None or match(*args, **kwargs):
            calls[0] += 1
            if calls[0] == nth:
                if when == "before":
                    die()
                result = original(*args, **kwargs)
                die()
                return result
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def run_in_child(target: Callable[[], Any]) -> int:
    """Run ``target()`` in a forked child; return its exit code (negative: killed by signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            target()
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else 1
        except BaseException:  # report and exit with a distinct status
            traceback.print_exc()
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


# --- the shared tiny run ------------------------------------------------------------------

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
            "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=4",
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
    for journal in ("journal.jsonl", "journal-twin.jsonl"):  # both files, after any repair
        assert scan(run_dir / "recovery" / journal, Q, SIGMA).rounds == charged
    ledger = json.loads((run_dir / "recovery" / "ledger.json").read_text())
    assert sum(e["count"] for e in ledger["events"]) == charged
    assert {p.name for p in (run_dir / "release").iterdir()} <= RELEASE_FILES
    leftovers = [p.name for p in [*run_dir.iterdir(), *(run_dir / "recovery").iterdir()]
                 if p.name.startswith(".")]
    assert leftovers == []
    newest = checkpoint.load_checkpoint(run_dir / "recovery")
    assert newest.round_done == retained
    released = released_adapter(run_dir)
    assert all(torch.equal(released[k], v) for k, v in peft_names(newest.state["adapter"]).items())


def released_adapter(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "release" / "adapter_model.safetensors"))


def peft_names(adapter: dict) -> dict:
    """Recovery keys (``...lora_A.default.weight``) as PEFT saves them (no adapter name)."""
    return {k.replace(".default", ""): v for k, v in adapter.items()}


def release_rounds(run_dir) -> int | None:
    path = run_dir / "release" / "certificate.json"
    return json.loads(path.read_text())["rounds_retained"] if path.exists() else None


def temporaries(run_dir) -> list[str]:
    return sorted(p.name for p in [*run_dir.iterdir(), *(run_dir / "recovery").iterdir()]
                  if p.name.startswith(".") and p.name != ".lock")


# (kill point, what the kill left behind, rounds charged after the resume). Rounds 1-2 are
# checkpointed at round 2; a kill after that replays rounds 3-4 and charges them twice.
