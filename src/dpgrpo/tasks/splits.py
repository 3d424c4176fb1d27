"""What a run reads of its training split before any model: its public slots and its questions.

* :func:`public_slots`: n by :func:`~dpgrpo.privacy.sampling.public_slot_count` (prompt level)
  or :func:`~dpgrpo.tasks.contributors.contributor_slots` (contributor level), from the split's
  size and the configuration, never from the content or validity of the records (assumption
  A1); the trainer (:mod:`dpgrpo.training.setup`) and the budget report
  (:mod:`dpgrpo.reports.budget`) both count n here, then take q, delta, sigma and C from
  :func:`dpgrpo.privacy.budget.public_constants`;
* :func:`training_questions` and :func:`split_questions`: the questions the content check of
  public data (:func:`dpgrpo.privacy.public_data.check_disjoint`) compares.

They live with the tasks, not in privacy/, because they load a split: the privacy core takes
the counts and the questions as values and never imports the task layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpgrpo.config import RunConfig
from dpgrpo.errors import EmptyDataError
from dpgrpo.privacy.contributors import CONTRIBUTOR, Contributor
from dpgrpo.privacy.sampling import SlotCount, public_slot_count
from dpgrpo.tasks import get_task, load_split
from dpgrpo.tasks.base import Problem
from dpgrpo.tasks.contributors import contributor_slots
from dpgrpo.tasks.custom import check_public_n


@dataclass(frozen=True)
class PublicSlots:
    """What fixes n: the split's records in slot order (before the canaries) and the count."""

    problems: list[Problem]           # prompt level: data.indices, or the first data.limit
    contributors: list[Contributor | None] | None  # contributor level: absent slots None
    count: SlotCount                  # n (canaries included) and the rule that fixed it
    skipped: int                      # invalid records (private: logged at debug level only)


def public_slots(config: RunConfig, task: Any = None) -> PublicSlots:
    """Load the split (not the model) and count its public slots, canaries included.

    Raises ConfigError when a custom task's list would make n private, or n is below the
    record count.
    """
    data = config.data
    task = get_task(data.task) if task is None else task
    check_public_n(task, data.n_slots, data.capacity)  # a private list's length is not public
    loaded = load_split(task, data.split, data.data_dir, source=data.source,
                        skip_invalid=data.skip_invalid)
    if not loaded.problems and loaded.skipped:  # a run on no data at all would still "release"
        first = loaded.skipped[0]
        raise EmptyDataError(f"no valid record: data.skip_invalid = true skipped every record "
                             f"of split {data.split!r} (the first: {first}); nothing to train on",
                             path=None)
    k = config.audit.canaries
    if data.privacy_unit == CONTRIBUTOR:  # the record is a contributor (privacy/contributors.py)
        contributors, count = contributor_slots(data, task, loaded, k)
        return PublicSlots([], contributors, count, len(loaded.skipped))
    problems = data.select(loaded.problems)      # data.indices, else the first data.limit
    count = public_slot_count(n_slots=data.n_slots, limit=data.capacity, problems=len(problems),
                              source_rows=len(loaded.problems) + len(loaded.skipped),
                              canaries=k, embedded=not task.needs_data_dir)
    if data.indices is not None and count.source == "data.limit":
        count = SlotCount(count.n, "data.indices", count.records)
    return PublicSlots(list(problems), None, count, len(loaded.skipped))


def training_questions(config: RunConfig) -> list[str]:
    """The questions a run of ``config`` trains on: its split (invalid records skipped as the
    run skips them), ``data.indices`` or the first ``data.limit`` at prompt level, the whole
    split otherwise."""
    data = config.data
    loaded = load_split(data.task, data.split, data.data_dir, source=data.source,
                        skip_invalid=data.skip_invalid)
    problems = loaded.problems
    if data.privacy_unit == "prompt":
        problems = data.select(problems)
    return [p.question for p in problems]


def split_questions(task: str, split: str, data_dir: str | None, source: str = "local"
                    ) -> list[str]:
    """Every question of ``split`` of ``task`` (invalid records skipped)."""
    return [p.question for p in load_split(task, split, data_dir, source=source,
                                           skip_invalid=True).problems]


__all__ = ["PublicSlots", "public_slots", "split_questions", "training_questions"]
