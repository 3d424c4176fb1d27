"""bench/vs_trl.py's baton: the arms' steps never run at the same time.

The benchmark times each arm's steps on the same machine; a step that shares the cores with
another arm's step is timed under that load. Until 2026-12-03 the parent handed the baton to
the next arm as soon as the first one had started, so all three arms' steps ran together.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import vs_trl  # noqa: E402

#: a stand-in arm: model "loaded", then STEPS steps of busy work, each between two batons
STUB = textwrap.dedent("""
    import json, sys, time
    spans = []
    for _ in range({steps}):
        print("@@ready null", flush=True)
        assert sys.stdin.readline().strip() == "go"
        start = time.monotonic()
        while time.monotonic() - start < {seconds}:
            pass
        spans.append((start, time.monotonic()))
    print("@@result " + json.dumps({{"spans": spans}}), flush=True)
""")


def test_one_arm_step_at_a_time_and_every_step_taken():
    commands = {arm: [sys.executable, "-c", STUB.format(steps=3, seconds=0.15)]
                for arm in ("trl", "non-private", "dp-grpo")}
    results = vs_trl.interleave(commands)
    assert sorted(results) == sorted(commands)
    spans = sorted((s, e, arm) for arm, r in results.items() for s, e in r["spans"])
    assert len(spans) == 9
    for (_, end, arm), (start, _, other) in zip(spans, spans[1:]):
        assert end <= start, f"a step of {other} started before one of {arm} ended"
    order = [arm for _, _, arm in spans]
    assert order[:3] == list(commands), "the arms take turns, in order"
