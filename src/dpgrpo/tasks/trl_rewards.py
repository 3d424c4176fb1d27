"""TRL's reward functions, called on ONE prompt's G completions at a time.

TRL's ``GRPOTrainer`` calls a reward function on a whole batch::

    def reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]

with one entry per completion in every list and each extra dataset column repeated per
completion. dpgrpo accepts such a function as is (:func:`is_trl_reward` recognises it by its
``prompts`` or ``completions`` parameter; :func:`trl_reward` marks one explicitly) and calls it
once per prompt: ``prompts`` is that prompt G times, ``completions`` its G completions,
``completion_ids`` their token ids (EOS included, as TRL gives them; None in evaluation, where
a completion is scored alone), and each column that prompt's own value G times. No call ever
holds two prompts, so a batch statistic inside the function (a mean over the call, a rank)
stays within the record (Section III-D); state kept between calls would not, and is the
function's author's to avoid.

As in TRL, a conversational prompt (a list of ``{"role", "content"}`` messages) gives
completions as ``[{"role": "assistant", "content": text}]``; ``None`` means "does not apply":
such a value is left out of the weighted sum (TRL's ``nansum``), so it adds 0.0, which is also
dpgrpo's rule for any non-finite value. TRL's ``trainer_state`` argument is not passed.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpgrpo.errors import ConfigError

#: the columns TRL does not pass to reward functions (it passes them as arguments, or not at all)
EXCLUDED_COLUMNS = ("prompt", "completion", "completion_ids")


@dataclass(frozen=True)
class TRLReward:
    """A reward function with TRL's signature (see the module docstring)."""

    fn: Callable[..., Sequence[float | None]]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"reward {self.fn!r} is not callable")

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def __call__(self, prompt: object, completions: Sequence[str], record: object,
                 completion_ids: Sequence[Sequence[int]] | None = None) -> list[float]:
        """The G rewards of one prompt's completions, None as NaN; ``record`` is the prompt's
        row (its columns go to the function, each repeated G times)."""
        g = len(completions)
        if isinstance(prompt, str):
            shown: list[object] = list(completions)
        else:  # a conversation: completions as assistant turns, as TRL gives them
            shown = [[{"role": "assistant", "content": c}] for c in completions]
        columns = {key: [value] * g for key, value in record_columns(record).items()}
        values = list(self.fn(prompts=[prompt] * g, completions=shown,
                              completion_ids=None if completion_ids is None
                              else [list(ids) for ids in completion_ids], **columns))
        if len(values) != g:
            raise ConfigError(f"reward {self.name!r} returned {len(values)} values for one "
                              f"prompt's {g} completions (TRL's convention: one per completion)")
        return [math.nan if v is None else float(v) for v in values]


def trl_reward(fn: Callable[..., Sequence[float | None]]) -> TRLReward:
    """Mark ``fn`` as a TRL reward function (for one whose signature does not show it)."""
    return fn if isinstance(fn, TRLReward) else TRLReward(fn)


def is_trl_reward(fn: Any) -> bool:
    """Whether ``fn`` follows TRL's convention: a :class:`TRLReward`, or a callable with a
    ``prompts`` or ``completions`` parameter (dpgrpo's own take ``(completion, problem)``)."""
    if isinstance(fn, TRLReward):
        return True
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "completions" in params or "prompts" in params


def record_columns(record: object) -> dict[str, object]:
    """The columns of one record that a TRL reward function receives: a row's fields but
    ``prompt``, ``completion`` and ``completion_ids``; a Problem's fields but ``question``."""
    if isinstance(record, Mapping):
        return {str(k): v for k, v in record.items() if k not in EXCLUDED_COLUMNS}
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {k: v for k, v in dataclasses.asdict(record).items() if k != "question"}
    return {}


__all__ = ["EXCLUDED_COLUMNS", "TRLReward", "is_trl_reward", "record_columns", "trl_reward"]
