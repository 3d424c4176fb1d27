"""The canaries a run plants for the one-run audit: their content, secret bits and saved plan.

Steps 1-3 of the canary protocol (Steinke, Nasr and Jagielski, 2023; DP-GRPO paper, Appendix B
"Canary diagnostic"; step 4, scoring them, is :mod:`dpgrpo.audit.canary`):

1. Before training, :func:`make_canaries` builds k random arithmetic problems with distinct,
   verifiable integer answers (ids ``canary-0000``...). Their content and seed are public.
2. :func:`draw_inclusion` draws one secret bit per canary, Bernoulli(1/2), from a
   ``torch.Generator`` or OS entropy. The trainer places the k canaries into k public slots; a
   slot whose bit is 0 stays empty (a null record: it can be sampled but contributes nothing).
   The canary slots are part of the slot universe n, so they enter q = m/n, delta = 1/(10 n) and
   the accounting like any other slot.
3. The trainer (:mod:`dpgrpo.training.setup`) saves the :class:`CanaryPlan` under
   ``RUN_DIR/recovery/canaries.json``. The bits are secret: :meth:`CanaryPlan.save` refuses any
   path inside a ``release`` folder.

The plan is the trainer's input, so it lives here, below the audit that reads it back;
:mod:`dpgrpo.audit.canary` re-exports every name.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DataError, ReleaseError
from dpgrpo.rundir.atomic import atomic_write_text
from dpgrpo.tasks import Problem

CANARY_PLAN_VERSION = 1


def make_canaries(k: int, *, seed: int, digits: int = 2) -> list[Problem]:
    """k random arithmetic problems ``a * b + c`` (``digits``-digit operands), distinct answers.

    Deterministic in the public ``seed``: the canaries' content is public, only their
    inclusion is secret. Ids are ``canary-0000``, ``canary-0001``, ... Difficulty matters for
    power: GRPO's advantage is zero on a prompt the policy always fails or always solves, so a
    canary leaves a trace mainly when the base sometimes solves it (DIBA Table 3, "Residual");
    raise ``digits`` for stronger models.
    """
    if k < 1:
        raise ValueError(f"need at least one canary, got k={k}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    rng = random.Random(seed)
    seen: set[int] = set()
    out: list[Problem] = []
    for _ in range(50 * k + 1000):
        if len(out) == k:
            break
        a, b, c = rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(lo, hi)
        answer = a * b + c
        if answer in seen:
            continue
        seen.add(answer)
        out.append(Problem(
            id=f"canary-{len(out):04d}",
            question=f"What is {a} * {b} + {c}?",
            answer=str(answer),
            solution=f"{a} * {b} = {a * b}. {a * b} + {c} = {answer}.\nThe answer is {answer}.",
        ))
    if len(out) < k:
        raise ValueError(f"could not find {k} canaries with distinct answers at {digits} "
                         "digits; use more digits")
    return out


def draw_inclusion(k: int, generator: torch.Generator | None = None) -> list[bool]:
    """k independent Bernoulli(1/2) inclusion bits; OS entropy when ``generator`` is None."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if generator is None:
        bits = int.from_bytes(os.urandom((k + 7) // 8 or 1), "little")
        return [bool((bits >> i) & 1) for i in range(k)]
    return [bool(b) for b in torch.randint(0, 2, (k,), generator=generator).tolist()]


def _inside_release(path: Path) -> bool:
    return "release" in path.resolve().parts


@dataclass(frozen=True)
class CanaryPlan:
    """The canaries, their secret inclusion bits and (once placed) their public slot indices."""

    canaries: tuple[Problem, ...]
    included: tuple[bool, ...]
    seed: int | None = None                 # public seed of make_canaries
    slots: tuple[int, ...] | None = None    # slot index of each canary, set by the trainer

    def __post_init__(self) -> None:
        object.__setattr__(self, "canaries", tuple(self.canaries))
        object.__setattr__(self, "included", tuple(bool(b) for b in self.included))
        if len(self.canaries) != len(self.included):
            raise ValueError(f"{len(self.canaries)} canaries but {len(self.included)} bits")
        if self.slots is not None:
            object.__setattr__(self, "slots", tuple(int(s) for s in self.slots))
            if len(self.slots) != len(self.canaries) or len(set(self.slots)) != len(self.slots):
                raise ValueError("slots must give one distinct slot per canary")

    @classmethod
    def create(cls, k: int, *, seed: int, generator: torch.Generator | None = None) -> CanaryPlan:
        """:func:`make_canaries` plus :func:`draw_inclusion` (OS entropy unless a generator)."""
        return cls(tuple(make_canaries(k, seed=seed)), tuple(draw_inclusion(k, generator)), seed)

    @property
    def present(self) -> list[Problem]:
        """The canaries whose bit is 1: the only ones the trainer may ever read."""
        return [c for c, b in zip(self.canaries, self.included) if b]

    def to_dict(self) -> JSON:
        """A JSON-ready dictionary (holds the secret bits)."""
        return {
            "version": CANARY_PLAN_VERSION,
            "seed": self.seed,
            "slots": None if self.slots is None else list(self.slots),
            "canaries": [{"id": c.id, "question": c.question, "answer": c.answer,
                          "solution": c.solution} for c in self.canaries],
            "included": list(self.included),
        }

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON, atomically. Refuses paths inside a ``release`` folder."""
        path = Path(path)
        if _inside_release(path):
            raise ReleaseError(f"refusing to write canary inclusion bits to {path}: they are "
                               "secret (they decide which canaries were trained on) and a "
                               "release must not contain them; use RUN_DIR/recovery/")
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CanaryPlan:
        """Read a plan written by :meth:`save`."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DataError(f"cannot read canary plan: {err}", path=str(path)) from None
        for key in ("canaries", "included"):
            if key not in data:
                raise DataError("missing", path=str(path), field=key)
        canaries = tuple(Problem(id=c["id"], question=c["question"], answer=c["answer"],
                                 solution=c.get("solution")) for c in data["canaries"])
        return cls(canaries, tuple(data["included"]), data.get("seed"), data.get("slots"))
