"""Strict typing of configuration values (issues 33, 59): what a TOML value or ``--set`` text may
be.

One set of rules for every table a user writes (the run config's sections and the experiment
tables ``[protocol]``, ``[study]``, ``[tune]``): a TOML value must already have the field's type
(a boolean is not a number, a number is not a string, a float is not an int); ``--set`` text is
parsed by the field's type. A field typed with ``Literal`` takes one of its strings
(:func:`check_choices`, called by each ``__post_init__``, so a dataclass built in code is
checked too). Every float must be finite (lists of floats included), and every numeric field at
most its entry in :data:`MAXIMA` (issue 56: the one place where the upper bounds live; the
lower bounds stay in each ``__post_init__`` with their reasons). :mod:`dpgrpo.config.loading`
calls these with the field's type and names the file, table and key in the error.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import types
import typing
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Literal

from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def _integer(value: object) -> int:
    """An int from a TOML int or an override's text; a bool, a float or "2.0" is refused (a
    count written as 2.0 is a typo, and True is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(value)
    return int(value.strip()) if isinstance(value, str) else value


def _item_name(inner: Any) -> str:
    if typing.get_origin(inner) is Literal:
        return "strings"
    return {int: "integers", float: "numbers", str: "strings"}.get(inner, "values")


def type_name(base: Any) -> str:
    """How an error names the type ``base`` ("an integer", "a list of strings", ...)."""
    if typing.get_origin(base) is tuple or base is tuple:
        inner = typing.get_args(base)[:1]
        return f"a list of {_item_name(inner[0]) if inner else 'strings'}"
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(base)))
    if _is_table(base):
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        base, getattr(base, "__name__", str(base)))


def _is_table(base: object) -> bool:
    """Whether ``base`` is ``Mapping[...]`` / ``dict[...]`` (a TOML table)."""
    origin = typing.get_origin(base) or base
    return isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)


def _number(value: object, text: bool) -> float:
    """A float from a TOML int or float, or an override's text: a bool or a string in TOML is
    refused (inf and nan parse, and :func:`check_finite` refuses them with the reason)."""
    if isinstance(value, bool) or (not text and isinstance(value, str)):
        raise ValueError(value)
    if not isinstance(value, (int, float, str)):
        raise ValueError(value)
    return float(value)


def _scalar(base: object, value: object, text: bool, *, strip: bool = True) -> object:
    """An int, a finite number or a string (a choice's membership is checked by
    :func:`check_choices`); a list's items are stripped of spaces."""
    if base is int:
        if not text and isinstance(value, str):
            raise ValueError(value)
        return _integer(value)
    if base is float:
        return _number(value, text)
    if not isinstance(value, str):
        raise ValueError(value)
    return value.strip() if strip else value


def parse_value(base: object, value: Any, text: bool) -> object:
    """``value`` as ``base``. TOML values (``text`` False) must already have the type: a TOML
    boolean is not a number, a number is not a string, a float is not an int, a float is
    finite, a table is a table. Override text (``text`` True) is parsed by the field's type; a
    list is comma-separated. ValueError (or TypeError) when it does not fit."""
    if typing.get_origin(base) is tuple or base is tuple:
        if isinstance(value, str):
            items: list[object] = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ValueError(value)
        inner = (typing.get_args(base) or (str,))[0]
        if inner is not int and inner is not float and any(
                not isinstance(v, str) for v in items):
            raise ValueError(value)
        parsed = tuple(_scalar(inner, v, isinstance(value, str)) for v in items)
        return tuple(v for v in parsed if v != "") if inner not in (int, float) else parsed
    if _is_table(base):
        if not isinstance(value, collections.abc.Mapping):
            raise ValueError(value)
        return dict(value)
    if text and not isinstance(value, str):
        raise ValueError(value)
    if base is bool:
        if isinstance(value, bool):
            return value
        if text and value.lower() in ("true", "1", "yes", "on"):
            return True
        if text and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(value)
    return _scalar(base, value, text, strip=False)


def field_type(cls: type, key: str) -> tuple[Any, bool]:
    """The type of field ``key`` of dataclass ``cls`` without ``| None``, and whether it may be
    None (KeyError for an unknown key)."""
    hint = _hints(cls)[key]
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = typing.get_args(hint) if is_union else ()
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    return base, optional


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def choices(literal: object) -> tuple[str, ...]:
    """The strings of a ``Literal[...]`` type, in order."""
    return tuple(typing.get_args(literal))


def check_choices(obj: DataclassInstance, section: str) -> None:
    """Every field typed ``Literal[...]`` (or a list of them) holds one of its strings; else
    a ConfigError that lists them. Called by each table's ``__post_init__``."""
    for f in fields(obj):
        base, _ = field_type(type(obj), f.name)
        value = getattr(obj, f.name)
        if value is None:
            continue
        many = typing.get_origin(base) is tuple
        inner = typing.get_args(base)[0] if many and typing.get_args(base) else base
        if typing.get_origin(inner) is not Literal:
            continue
        allowed = choices(inner)
        for item in (value if many else (value,)):
            if item not in allowed:
                raise ConfigError(f"{section}.{f.name} must be one of {', '.join(allowed)}; "
                                  f"got {item!r}")


_COUNT = 10 ** 12  # a count of problems or slots: beyond any data set, exact in fp64 and int64
_SIZE = 10 ** 7    # a per-round or per-pass size: beyond any machine's memory

#: ``section.key`` -> the largest value it may take (issue 56). Public bounds, set without the
#: data: each one is orders of magnitude past any sensible run and well inside the arithmetic
#: (fp32 parameters and AdamW state, fp64 sums, int64 counts), so a typo is refused at load
#: instead of overflowing after rounds were charged (a non-finite step is still skipped).
MAXIMA: dict[str, float] = {
    "model.lora_rank": 65536,              # no model has a wider projection
    "model.lora_alpha": 1e6,               # alpha / r scales the adapter's output
    "data.limit": _COUNT,
    "data.n_slots": _COUNT,
    "data.per_contributor": _SIZE,
    "privacy.epsilon": 1e6,                # exp(epsilon) bounds the likelihood ratio
    "privacy.expected_batch": _COUNT,      # q n <= n (checked against n at build)
    # C: a LoRA gradient's per-prompt norm is O(1); 1e6 keeps sigma C (the noise's scale),
    # the sum of B clipped records and the update cast to fp32 (max 3.4e38) finite, where C =
    # 1e30 or 1e308 overflowed in fp32 and left NaN weights (issue 56)
    "privacy.clip_norm": 1e6,
    "privacy.noise_multiplier": 1e6,
    "privacy.seed": 2 ** 63 - 1,           # a 64-bit generator seed
    # T: 10^6 GRPO rounds is years of a GPU's time. Calibrating sigma to epsilon for T = 10^7
    # ran past 280 s on the CPU (PLD composition; T = 10^5 takes 18 s), and T = 10^20 hung
    "train.rounds": 10 ** 6,
    "train.group_size": 4096,              # G completions per prompt
    "train.temperature": 100.0,
    "train.repetition_penalty": 100.0,
    "train.max_new_tokens": _SIZE,
    "train.beta": 1e6,
    # AdamW moves each weight by about lr a step: lr > 1 replaces the adapter every round,
    # and lr = 1e38 overflowed inside the fp32 step (issue 56)
    "train.learning_rate": 1.0,
    "train.weight_decay": 1e6,             # AdamW multiplies each weight by 1 - lr wd
    "train.max_update_norm": 1e12,
    "train.frozen_layer_cache_mb": 1e9,    # a petabyte
    "train.rows_per_pass": _SIZE,
    "train.rollout_batch_size": _SIZE,
    "train.checkpoint_every": _SIZE,
    "train.max_tokens_per_pass": 1e12,
    "audit.canaries": _COUNT,
    "audit.canary_seed": 2 ** 63 - 1,      # a 64-bit generator seed
    "reward_weights": 1e6,                 # |w| of a task's reward functions (tasks.custom)
}


def _show(x: float) -> str:
    """A bound as the table writes it: 10000000, 1e6, 0.5 (not 1e+06)."""
    return str(x) if isinstance(x, int) else f"{x:g}".replace("e+0", "e").replace("e+", "e")


def check_finite(obj: DataclassInstance, section: str) -> None:
    """Every float field finite (each number of a list too) and every numeric field at most its
    :data:`MAXIMA` entry: inf or nan in a learning rate, a temperature or a privacy parameter
    would train (or certify) something meaningless without a word, and a finite but huge one
    overflows later, after rounds were charged (``clip_norm = 1e308`` released a NaN adapter;
    issue 56)."""
    for f in fields(obj):
        key, value = f"{section}.{f.name}", getattr(obj, f.name)
        items = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            what = "finite numbers" if isinstance(value, tuple) else "a finite number"
            raise ConfigError(f"'{key}' must be {what}, got {value}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key in MAXIMA and value > MAXIMA[key]:
            raise ConfigError(f"'{key}' must be at most {_show(MAXIMA[key])}, got {_show(value)} "
                              "(the bounds: dpgrpo.config.values.MAXIMA)")


def check_weights(weights: collections.abc.Sequence[object] | None,
                  key: str = "reward_weights") -> None:
    """Reward weights finite and of magnitude at most ``MAXIMA["reward_weights"]``: a NaN weight
    makes every reward NaN, which the reward sum counts 0 (no signal), and the run would train
    and certify on nothing without a word (issue 56)."""
    if weights is None:
        return
    bound = MAXIMA["reward_weights"]
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                or abs(w) > bound:
            raise ConfigError(f"{key} must be finite numbers of magnitude at most {_show(bound)}, "
                              f"got {list(weights)}")


__all__ = ["MAXIMA", "check_choices", "check_finite", "check_weights", "choices",
           "field_type", "parse_value", "type_name"]
