"""Strict typing of configuration values (issue 33): what a TOML value or ``--set`` text may be.

A TOML value must already have the field's type (a boolean is not a number, a number is not a
string, a float is not an int); ``--set`` text is parsed by the field's type. Every float
field must be finite. :mod:`dpgrpo.config` calls these with the field's type and names the key
in the error.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields
from typing import Any

from dpgrpo.errors import ConfigError


def _integer(value: Any) -> int:
    """An int from a TOML int or an override's text; a bool, a float or "2.0" is refused (a
    count written as 2.0 is a typo, and True is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(value)
    return int(value.strip()) if isinstance(value, str) else value


def type_name(base: Any) -> str:
    """How an error names the type ``base`` ("an integer", "a list of strings", ...)."""
    if typing.get_origin(base) is tuple or base is tuple:
        inner = typing.get_args(base)[:1]
        return f"a list of {'integers' if inner == (int,) else 'strings'}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        base, getattr(base, "__name__", str(base)))


def parse_value(base: Any, value: Any, text: bool) -> Any:
    """``value`` as ``base``. TOML values (``text`` False) must already have the type: a TOML
    boolean is not a number, a number is not a string, a float is not an int. Override text
    (``text`` True) is parsed by the field's type."""
    if typing.get_origin(base) is tuple or base is tuple:
        if isinstance(value, str):
            items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ValueError(value)
        if typing.get_args(base)[:1] == (int,):
            return tuple(_integer(v) for v in items)
        if not all(isinstance(v, str) for v in items):
            raise ValueError(value)
        return tuple(v.strip() for v in items if v.strip())
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
    if base is int:
        if not text and isinstance(value, str):
            raise ValueError(value)
        return _integer(value)
    if base is float:
        if isinstance(value, bool) or (not text and isinstance(value, str)):
            raise ValueError(value)
        if not isinstance(value, (int, float, str)):
            raise ValueError(value)
        return float(value)
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def check_finite(obj: Any, section: str) -> None:
    """Every float field finite: inf or nan in a learning rate, a temperature or a privacy
    parameter would train (or certify) something meaningless without a word."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"'{section}.{f.name}' must be a finite number, got {value}")


__all__ = ["check_finite", "parse_value", "type_name"]
