"""Contributor-level DP: the record is a contributor, not a prompt (the paper's Section IX).

With ``data.privacy_unit = "contributor"`` Algorithm 1 runs unchanged over contributor slots:

* **slots**: n = ``data.n_slots`` public contributor slots (:func:`contributor_slot_count`;
  required: the number of contributors is a function of the private data, so it never sets n);
  each round Poisson-samples them with q = m / n;
* **k problems**: a sampled contributor takes part with at most k (``data.per_contributor``,
  public) of its problems, chosen uniformly without replacement from hidden randomness
  (:class:`ProblemChooser`: 128 bits of OS entropy per problem, or the debugging seed);
* **one gradient per contributor**: the per-prompt gradients of its chosen problems (each
  computed from that prompt's rows alone, :mod:`dpgrpo.training.grads`) are summed
  (:func:`sum_within_records`) before the mechanism, which clips that sum to C once, adds the
  noise once and divides by q n (:mod:`dpgrpo.privacy.mechanism`, still the only place where
  different records meet).

Adding or removing one contributor, whatever the number of problems it owns, changes the
clipped sum by at most C, so the accountant is the prompt-level one with n = contributor
slots: the certificate's epsilon protects one contributor (``unit``). k bounds the compute per
round, not the guarantee. Prompt-level DP protects a contributor with k problems only through
group privacy (``dpgrpo privacy report`` shows both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.privacy.sampling import SlotCount
from dpgrpo.privacy.seeds import SeededOrSecure

if TYPE_CHECKING:
    import torch

    from dpgrpo.privacy.seeds import GeneratorState

PROMPT, CONTRIBUTOR = "prompt", "contributor"
UNITS = (PROMPT, CONTRIBUTOR)
KEY_BYTES = 16  # 128 secret bits per problem key


def unit_description(privacy_unit: str, per_contributor: int) -> str:
    """What the certificate's epsilon protects (its ``unit``)."""
    if privacy_unit == CONTRIBUTOR:
        return f"one contributor (up to {per_contributor} problems per round)"
    return "one prompt (problem + reference answer)"


@dataclass(frozen=True)
class Contributor:
    """One record under contributor-level DP: a contributor's (task, problem) pairs, in slot
    order (the order of the data file)."""

    id: str
    problems: tuple[tuple[object, object], ...]


def contributor_slot_count(*, n_slots: int | None, contributors: int,
                           canaries: int) -> SlotCount:
    """n contributor slots: ``data.n_slots``, required (A1).

    The number of contributors (in the data or the mapping file) is a function of the private
    data, so it never sets n; ``data.limit`` is refused at contributor level (DataConfig).
    ``contributors`` is the number placed; each canary is a contributor of one problem.
    """
    if n_slots is None:
        raise ConfigError("data.privacy_unit = 'contributor' needs data.n_slots, the public "
                          "number of contributor slots n (the contributor count is private)")
    records = contributors + canaries
    if n_slots < records:
        raise ConfigError(f"data.n_slots = {n_slots} is smaller than the {records} contributor "
                          "records (contributors + canaries)")
    return SlotCount(n_slots, "data.n_slots", records)


def as_contributors(slots: Sequence[tuple[Any, Any] | None]) -> list[Contributor | None]:
    """Prompt slots (e.g. canaries) as contributors of one problem each."""
    return [None if s is None else Contributor(s[1].id, (s,)) for s in slots]


class ProblemChooser(SeededOrSecure):
    """Which k of a sampled contributor's problems a round uses (hidden randomness, A3).

    Each problem gets a fresh 128-bit key from ``os.urandom`` (secure mode) or from the
    debugging seed's stream (seeded mode); the k smallest keys win: a uniformly random k-subset.
    A contributor with at most k problems uses all of them.
    """

    def __init__(self, k: int, *, seed: int | None = None,
                 entropy: Callable[[int], bytes] | None = None) -> None:
        if k < 1:
            raise ConfigError(f"data.per_contributor must be >= 1, got {k}")
        self.k, self.seed = k, seed
        self._rng = np.random.Generator(np.random.PCG64(seed)) if seed is not None else None
        self._entropy = entropy or os.urandom

    def choose(self, m: int, entropy: Callable[[int], bytes] | None = None) -> list[int]:
        """Sorted indices of the problems used, out of ``m``.

        ``entropy``: the record's own key source (the trainer passes the contributor's
        (round, slot) stream, so its choice cannot depend on the batch-mates drawn before it);
        default the chooser's own (OS entropy, or the seed's stream)."""
        if m <= self.k:
            return list(range(m))
        if entropy is not None:
            raw = entropy(KEY_BYTES * m)
        elif self._rng is not None:
            raw = self._rng.bytes(KEY_BYTES * m)
        else:
            raw = self._entropy(KEY_BYTES * m)
        if len(raw) != KEY_BYTES * m:
            raise PrivacyError(f"the entropy source returned {len(raw)} bytes, not {KEY_BYTES * m}")
        keys = [raw[KEY_BYTES * i:KEY_BYTES * (i + 1)] for i in range(m)]
        return sorted(sorted(range(m), key=keys.__getitem__)[:self.k])

    def state_dict(self) -> GeneratorState:
        if self._rng is None:
            return {"source": "os-entropy"}
        return {
            "source": "seeded",
            "seed": self.seed,
            "bit_generator": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: GeneratorState) -> None:
        if state.get("source") == "seeded" and self._rng is not None:
            self._rng.bit_generator.state = state["bit_generator"]


@dataclass(frozen=True)
class RoundPrompts:
    """The prompts of one round's records: record r owns ``prompts[bounds[r]:bounds[r + 1]]``."""

    prompts: list[tuple[Any, Any]]
    bounds: tuple[int, ...]

    @property
    def num_records(self) -> int:
        return len(self.bounds) - 1

    @property
    def one_per_record(self) -> bool:
        return len(self.prompts) == self.num_records


def round_prompts(records: Sequence[Any], chooser: ProblemChooser | None,
                  sources: Sequence[Callable[[int], bytes]] | None = None) -> RoundPrompts:
    """Prompt-level (``chooser`` None): each record is one (task, problem). Contributor-level:
    each :class:`Contributor` brings the problems ``chooser`` picks, at most k, from record
    r's own key source ``sources[r]`` when given (the trainer's: bound to its round and slot)."""
    if chooser is None:
        return RoundPrompts(list(records), tuple(range(len(records) + 1)))
    if sources is not None and len(sources) != len(records):
        raise PrivacyError(f"{len(sources)} key sources for {len(records)} records")
    prompts: list[tuple[object, object]] = []
    bounds = [0]
    for r, record in enumerate(records):
        own = None if sources is None else sources[r]
        prompts += [record.problems[i] for i in chooser.choose(len(record.problems), own)]
        bounds.append(len(prompts))
    return RoundPrompts(prompts, tuple(bounds))


def sum_within_records(grads: dict[str, torch.Tensor],
                       plan: RoundPrompts) -> dict[str, torch.Tensor]:
    """Per-record gradients from per-prompt ones: record r's is the sum of its own prompts'
    gradients, added in a fixed order (so it is bit-identical whatever the other records).

    name -> (P, *shape) becomes name -> (R, *shape); nothing crosses a record boundary. A
    record with a non-finite prompt gradient has a non-finite sum, which the mechanism turns
    into zero (the whole record, by the same fixed rule).
    """
    if plan.one_per_record:
        return grads
    import torch

    out = {}
    for name, t in grads.items():
        if t.shape[0] != len(plan.prompts):
            raise PrivacyError(f"{name}: {t.shape[0]} per-prompt gradients for "
                               f"{len(plan.prompts)} prompts")
        rows = []
        for lo, hi in zip(plan.bounds[:-1], plan.bounds[1:]):
            acc = torch.zeros_like(t[0]) if hi == lo else t[lo].clone()
            for j in range(lo + 1, hi):
                acc += t[j]
            rows.append(acc)
        out[name] = torch.stack(rows) if rows else t.new_zeros((0, *t.shape[1:]))
    return out


__all__ = [
    "CONTRIBUTOR",
    "PROMPT",
    "UNITS",
    "Contributor",
    "ProblemChooser",
    "RoundPrompts",
    "as_contributors",
    "contributor_slot_count",
    "round_prompts",
    "sum_within_records",
    "unit_description",
]
