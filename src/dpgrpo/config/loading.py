"""A run config in and out of TOML: reading, strict typing of every key, overrides, writing.

:mod:`dpgrpo.config.schema` defines the sections (one frozen dataclass per TOML table, each
validated in ``__post_init__``, and docs/config.md is generated from their field comments);
this module turns text into them and back: :func:`read_toml`, :func:`config_from_dict`
(unknown sections and keys refused, each value typed strictly by its field),
:func:`load_config` and :func:`apply_overrides` (``section.key=value`` strings),
:func:`to_toml`, the embedded demo (:func:`embedded_default`) and a protocol config with its
``[protocol]`` table. Import these from :mod:`dpgrpo.config`.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
import types
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Sequence

from dpgrpo.config.schema import (
    AuditConfig,
    DataConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    TrainConfig,
)
from dpgrpo.config.values import parse_value, type_name
from dpgrpo.errors import ConfigError, DPGRPOError

_CLASSES = {"model": ModelConfig, "data": DataConfig, "privacy": PrivacyConfig,
            "train": TrainConfig, "audit": AuditConfig}

#: keys that were renamed: a config that still uses the old name is refused with the new one
#: (a run directory saved under the old name is read by dpgrpo.rundir.resume.as_written)
RENAMED = {"train.steps": "train.rounds"}


def _coerce(section: str, key: str, value: Any, *, text: bool = False) -> Any:
    """The value of ``section.key`` typed strictly by the field (see :func:`dpgrpo.config.values.parse_value`); a value
    of the wrong type is a ConfigError naming the key, never silently converted."""
    cls = _CLASSES[section]
    hints = typing.get_type_hints(cls)
    dotted = f"{section}.{key}"
    if dotted in RENAMED:
        raise ConfigError(f"{dotted} was renamed {RENAMED[dotted]}")
    if key not in hints:
        known = ", ".join(f.name for f in fields(cls))
        raise ConfigError(f"unknown key '{section}.{key}' (known: {known})")
    hint = hints[key]
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = typing.get_args(hint) if is_union else ()
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and optional):
        if not optional:
            raise ConfigError(f"'{section}.{key}' cannot be empty")
        return None
    try:
        return parse_value(base, value, text)
    except (TypeError, ValueError):
        raise ConfigError(f"'{section}.{key}' expects {type_name(base)}, got {value!r}") from None


def config_from_dict(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts (TOML sections), rejecting unknown keys."""
    sections: dict[str, Any] = {}
    for section, values in data.items():
        if section not in _CLASSES:
            raise ConfigError(f"{source}: unknown section [{section}] (known: {', '.join(_CLASSES)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        try:
            kwargs = {k: _coerce(section, k, v) for k, v in values.items()}
            sections[section] = _CLASSES[section](**kwargs)
        except DPGRPOError as err:  # name the file too: "c.toml: 'train.rounds' expects ..."
            raise type(err)(f"{source}: {err}") from None
    try:
        return RunConfig(**sections)
    except DPGRPOError as err:
        raise type(err)(f"{source}: {err}") from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or bad TOML is a ConfigError naming the file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 by definition
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); "
                          "TOML files must be UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a TOML config file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML ({err})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a TOML file (or the defaults) with ``section.key=value`` overrides merged in.

    The file and the overrides are validated together, once: a key the file lacks may come
    from an override (e.g. ``data.n_slots`` for a contributor-level file).
    """
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    data.pop("protocol", None)  # settings of `dpgrpo protocol`; not part of one run's config
    data.pop("study", None)     # settings of `dpgrpo study`; likewise
    data.pop("tune", None)      # settings of `dpgrpo tune` (dpgrpo.experiments.tune)
    return config_from_dict(_merge(data, overrides or []), source=str(path or "defaults"))


def _merge(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """TOML sections with the overrides merged in, so that both are validated together."""
    for section, values in _parse_overrides(list(overrides)).items():
        if isinstance(data.setdefault(section, {}), dict):  # else config_from_dict says so
            data[section].update(values)
    return data


def _parse_overrides(overrides: list[str]) -> dict[str, dict[str, Any]]:
    """``section.key=value`` strings as section -> key -> typed value (a later one wins)."""
    changes: dict[str, dict[str, Any]] = {}
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, value = item.split("=", 1)
        section, key = dotted.strip().split(".", 1)
        if section not in _CLASSES:
            raise ConfigError(f"unknown section '{section}' in override {item!r}")
        changes.setdefault(section, {})[key] = _coerce(section, key, value.strip(), text=True)
    return changes


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.key=value`` strings, each parsed to the field's type (a later one wins).

    The result is validated once, so the order of the overrides does not matter.
    """
    changes = _parse_overrides(overrides)
    if not changes:
        return config
    return replace(config, **{section: replace(getattr(config, section), **values)
                              for section, values in changes.items()})


def to_toml(config: RunConfig) -> str:
    """Render a config as TOML (None values are omitted)."""
    lines: list[str] = []
    for section, values in dataclasses.asdict(config).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool):
                lines.append(f"{key} = {str(value).lower()}")
            elif isinstance(value, (int, float)):
                lines.append(f"{key} = {value!r}")
            elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
                lines.append(f"{key} = [{', '.join(str(v) for v in value)}]")
            elif isinstance(value, (list, tuple)):
                lines.append(f"{key} = [{', '.join(repr(str(v)).replace(chr(39), chr(34)) for v in value)}]")
            else:
                lines.append(f'{key} = "{value}"')
        lines.append("")
    return "\n".join(lines)


#: the laptop demo behind a bare ``dpgrpo train``, shipped inside the package
EMBEDDED_DEFAULT = Path(__file__).with_name("cpu-demo.toml")


@functools.cache
def embedded_default() -> RunConfig:
    """The laptop demo behind a bare ``dpgrpo train`` (:data:`EMBEDDED_DEFAULT`): SmolLM2-135M
    on the embedded arithmetic task at epsilon = 8, with small m, G and T so it finishes in
    minutes on 2 CPU cores."""
    return load_config(EMBEDDED_DEFAULT)


def load_protocol_config(path: str | Path | None, overrides: Sequence[str] = ()
                         ) -> tuple[RunConfig, dict[str, Any]]:
    """A training config and its ``[protocol]`` table (:mod:`dpgrpo.experiments.protocol`; stripped, like
    ``[study]``, before the RunConfig is built).

    ``path`` None: the embedded CPU demo. Overrides are ``section.key=value`` strings.
    """
    if path is None:
        return apply_overrides(embedded_default(), list(overrides)), {}
    path = Path(path)
    data = read_toml(path)
    table = data.pop("protocol", {})
    data.pop("study", None)     # settings of `dpgrpo study` (dpgrpo.experiments.study)
    data.pop("tune", None)      # settings of `dpgrpo tune`
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [protocol] must be a table")
    return config_from_dict(_merge(data, overrides), source=str(path)), table
