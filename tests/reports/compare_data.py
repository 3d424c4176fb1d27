"""Synthetic evaluation outputs with known effects, shared by the report and CLI tests.

300 problems; the base solves problems 0-149 (50.00%). Every arm's robust scorer additionally
credits problems 280-289, so robust = strict + 3.33 pp for every arm and every delta is equal.

    arm       seed 1 (%)  seed 2 (%)  mean    vs base
    control   50.00       51.00       50.50   +0.50
    dp-grpo   58.00       57.00       57.50   +7.50
    sft       49.00       50.00       49.50   -0.50

dp-grpo - control per seed: +8.00 / +6.00 (sd 1.41); - sft: +9.00 / +7.00; - base: +8 / +7.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

N = 300


def _row(right: list[range] = (), wrong: list[range] = ()) -> np.ndarray:
    c = np.zeros(N, dtype=bool)
    c[:150] = True
    for r in right:
        c[list(r)] = True
    for r in wrong:
        c[list(r)] = False
    return c


STRICT = {
    ("base", 0): _row(),
    ("control", 1): _row([range(150, 160)], [range(0, 10)]),
    ("control", 2): _row([range(160, 169)], [range(10, 16)]),
    ("dp-grpo", 1): _row([range(200, 230)], [range(20, 26)]),
    ("dp-grpo", 2): _row([range(200, 227)], [range(20, 26)]),
    ("sft", 1): _row([], [range(30, 33)]),
    ("sft", 2): _row([range(240, 246)], [range(30, 36)]),
}
TOKENS = {"base": 100, "control": 110, "dp-grpo": 120, "sft": 130}   # + seed
CAPS = {"base": 3, "control": 6, "dp-grpo": 0, "sft": 12}            # problems at the cap


def robust(strict: np.ndarray) -> np.ndarray:
    out = strict.copy()
    out[280:290] = True
    return out


def write_eval(folder: Path, arm: str | None, seed: int | None, strict: np.ndarray, *,
               ids: list[str] | None = None, summary: bool = True) -> Path:
    """Write predictions.jsonl (+ summary.json) like `dpgrpo eval` does."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"p{j:03d}" for j in range(N)]
    rob = robust(strict)
    name = arm or "x"
    with open(folder / "predictions.jsonl", "w", encoding="utf-8") as fh:
        for j, pid in enumerate(ids):
            fh.write(json.dumps({
                "id": pid, "response": "…", "n_tokens": TOKENS.get(name, 100) + (seed or 0),
                "hit_cap": j < CAPS.get(name, 0),
                "scores": {"strict": {"extracted": "1", "correct": bool(strict[j]),
                                      "timed_out": False},
                           "robust": {"extracted": "1", "correct": bool(rob[j]),
                                      "timed_out": False}}}) + "\n")
    if summary:
        (folder / "summary.json").write_text(json.dumps({
            "task": "math", "model": "m", "adapter": None, "arm": arm, "seed": seed,
            "n": N, "accuracy": {"strict": float(strict.mean())}}), encoding="utf-8")
    return folder


def write_all(root: Path) -> tuple[Path, list[Path]]:
    """The base dir and the six arm dirs (one per seed), all with summary.json."""
    dirs = [write_eval(root / f"{arm}-seed{s}", arm, s, c)
            for (arm, s), c in STRICT.items() if arm != "base"]
    return write_eval(root / "base", "base", 0, STRICT[("base", 0)]), dirs


def matrix(arm: str, scorer: str = "strict") -> np.ndarray:
    rows = [c for (a, _), c in sorted(STRICT.items()) if a == arm]
    return np.stack([robust(r) if scorer == "robust" else r for r in rows])
