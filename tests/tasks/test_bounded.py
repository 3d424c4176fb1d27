"""The wall-clock bound of verifier checks: signal timer, worker process, guard."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from dpgrpo.tasks.bounded import run_bounded
from dpgrpo.tasks.symbolic import parse_answer, pathology, symbolic_equal


def test_signal_bound_interrupts_and_returns_value_otherwise() -> None:
    start = time.monotonic()
    assert run_bounded(time.sleep, (600,), 0.2, mode="signal") == (None, True)
    assert time.monotonic() - start < 60  # interrupted, long before the 600 s sleep ends
    assert run_bounded(divmod, (7, 2), 1.0, mode="signal") == ((3, 1), False)


def test_signal_bound_restores_the_callers_timer_and_handler() -> None:
    fired: list[int] = []
    def handler(signum: int, frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 600.0)
        run_bounded(divmod, (1, 1), 1.0, mode="signal")
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        # the outer timer is still armed, minus elapsed time (not disarmed, not the 1 s bound)
        assert 60.0 < remaining <= 600.0
        assert signal.getsignal(signal.SIGALRM) is handler and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_signal_mode_refuses_other_threads() -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            run_bounded(divmod, (1, 1), 1.0, mode="signal")
        except RuntimeError as err:
            errors.append(err)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert len(errors) == 1


def test_worker_process_bound_from_a_thread() -> None:
    """Off the main thread the check runs in a worker process, which is killed on overrun."""
    results: dict[str, object] = {}

    def body() -> None:
        start = time.monotonic()
        results["slow"] = run_bounded(time.sleep, (600,), 0.5)
        results["slow_s"] = time.monotonic() - start
        results["equal"] = symbolic_equal("\\frac12", "0.5", timeout_s=120)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert results["slow"] == (None, True)
    assert results["slow_s"] < 60  # killed long before the 600 s sleep (worker start-up included)
    assert results["equal"].equal and not results["equal"].timed_out


@pytest.mark.parametrize("latex, refused", [
    ("10^{10^{10}}", True),
    ("2^{2^{2^{2^{2}}}}", False),  # 2^65536 has ~20k digits: feasible
    ("10^{1000}", False),
    ("1^{10^{100}}", False),
    ("100000000!", True),
    ("20!", False),
    ("\\frac{1}{10^{10^{8}}}", True),
    ("x^{10^{9}}", True),
    ("(x+1)^{3}", False),
])
def test_guard(latex: str, refused: bool) -> None:
    assert (pathology(parse_answer(latex)) is not None) is refused


def test_empty_answers_are_not_equal() -> None:
    assert not symbolic_equal("1", "").equal
    assert not symbolic_equal("1", "\\text{}").equal


def test_the_whole_scorer_runs_under_the_bound() -> None:
    from dpgrpo.tasks import Problem, get_task
    from dpgrpo.tasks.base import bounded_score

    def stalls(response, problem, *, hit_cap=False, timeout_s=10.0):
        while True:  # an extraction that never ends
            pass

    start = time.monotonic()
    verdict = bounded_score(stalls, "x", Problem("p", "q", "1"), timeout_s=0.2)
    assert verdict.timed_out and not verdict.correct and verdict.extracted is None
    assert time.monotonic() - start < 60  # cut off: the extraction never ends by itself
    # A real scorer whose fallback extraction is superlinear on this input is cut off too.
    robust = get_task("math", check_timeout_s=0.3).scorers()["robust"]
    start = time.monotonic()
    verdict = robust("\\(" * 40_000, Problem("p", "q", "1"))
    assert verdict.timed_out and not verdict.correct and time.monotonic() - start < 60


def test_a_swallowed_timeout_is_raised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc
    import sys
    import weakref

    swallowed: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))

    class Holder:
        pass

    def stubborn() -> None:
        holder = Holder()
        ref = weakref.ref(holder, lambda r: time.sleep(0.5))  # the first alarm lands here
        del holder
        gc.collect()
        assert ref() is None
        give_up = time.monotonic() + 600.0  # without a second alarm the call would run on
        while time.monotonic() < give_up:
            pass

    start = time.monotonic()
    assert run_bounded(stubborn, (), 0.2, mode="signal") == (None, True)
    assert time.monotonic() - start < 60  # the second alarm ended it, not the 600 s give-up
    assert swallowed and swallowed[0].__name__ == "CheckTimeout"
