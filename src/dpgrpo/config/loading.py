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
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from dpgrpo.config.experiments import (
    DEFAULT_RECIPES,
    EXPERIMENT_TABLES,
    GridPoint,
    ProtocolSettings,
    StudySettings,
    TuneSettings,
)
from dpgrpo.config.schema import (
    AuditConfig,
    DataConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    TrainConfig,
)
from dpgrpo.config.values import field_type, parse_value, type_name
from dpgrpo.errors import ConfigError, DPGRPOError

_CLASSES = {"model": ModelConfig, "data": DataConfig, "privacy": PrivacyConfig,
            "train": TrainConfig, "audit": AuditConfig}

#: keys that were renamed: a config that still uses the old name is refused with the new one
#: (a run directory saved under the old name is read by dpgrpo.rundir.migrate.as_written)
RENAMED = {"train.steps": "train.rounds"}


def _coerce(section: str, key: str, value: object, *, text: bool = False) -> Any:
    """The value of run-config key ``section.key`` typed strictly by its field (see
    :func:`typed_value`)."""
    dotted = f"{section}.{key}"
    if dotted in RENAMED:
        raise ConfigError(f"{dotted} was renamed {RENAMED[dotted]}")
    return typed_value(_CLASSES[section], section, key, value, text=text)


def typed_value(cls: type, section: str, key: str, value: object, *, text: bool = False) -> object:
    """``value`` for field ``key`` of the table ``cls`` (``[section]``), typed strictly by the
    field (:func:`dpgrpo.config.values.parse_value`): an unknown key, or a value of the wrong
    type, is a ConfigError naming ``section.key``, never silently converted."""
    try:
        base, optional = field_type(cls, key)
    except KeyError:
        known = ", ".join(f.name for f in fields(cls))
        raise ConfigError(f"unknown key '{section}.{key}' (known: {known})") from None
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and optional):
        if not optional:
            raise ConfigError(f"'{section}.{key}' cannot be empty")
        return None
    try:
        return parse_value(base, value, text)
    except (TypeError, ValueError):
        raise ConfigError(f"'{section}.{key}' expects {type_name(base)}, got {value!r}") from None


T = typing.TypeVar("T")


def table_from_dict(cls: type[T], table: object, *, section: str, source: str = "config",
                    text: bool = False) -> T:
    """One TOML table as the frozen dataclass ``cls``: the one strict loader of every table a
    user writes (the run config's sections and the experiment tables ``[protocol]``,
    ``[study]``, ``[tune]``). Unknown keys and values of the wrong type are refused, and the
    dataclass's ``__post_init__`` checks the rest; every error names ``source``, the table
    and the key."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{section}] must be a table")
    try:
        kwargs = {k: typed_value(cls, section, k, v, text=text) for k, v in table.items()}
        return cls(**kwargs)
    except DPGRPOError as err:  # name the file too: "c.toml: 'study.sweep' expects ..."
        raise type(err)(f"{source}: {err}") from None


def config_from_dict(data: Mapping[str, object], *, source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts (TOML sections), rejecting unknown keys."""
    sections: dict[str, Any] = {}
    for section, values in data.items():
        if section not in _CLASSES:
            raise ConfigError(
                f"{source}: unknown section [{section}] (known: {', '.join(_CLASSES)})"
            )
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


def check_override_table(table: object, where: str) -> dict[str, object]:
    """A table of ``"section.key" = value`` overrides of the run config (a protocol recipe, the
    study's leaky, private-audit and warm-start runs): each key must be a run-config key and
    each value parse as that field's ``--set`` text; ConfigError naming ``where`` otherwise.
    Nested tables (``[x.train] learning_rate = ...``) are flattened first."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of \"section.key\" = value")
    flat = _flatten("", table)
    try:
        _parse_overrides([f"{k}={override_text(v)}" for k, v in flat.items()])
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return flat


def override_text(value: object) -> str:
    """A TOML or Python value as ``--set`` text: true/false, none, a comma-separated list,
    else str()."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(override_text(v) for v in value)
    return str(value)


def override_strings(overrides: Mapping[str, object] | Sequence[str] | None) -> list[str]:
    """``section.key=value`` strings from a mapping ``{"train.rounds": 3}`` (values as
    :func:`override_text` writes them) or a list of such strings (the API's ``overrides``)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={override_text(value)}" for key, value in overrides.items()]
    return list(overrides)


def _flatten(prefix: str, value: object) -> dict[str, object]:
    """``{"train": {"learning_rate": x}}`` -> ``{"train.learning_rate": x}``."""
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, item in value.items()
            for k, v in _flatten(f"{prefix}.{key}" if prefix else key, item).items()}


def read_toml(path: str | Path) -> dict[str, object]:
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
    data: dict[str, object] = read_toml(path) if path is not None else {}
    split_tables(data, source=str(path))   # the experiment tables: checked, not part of a run
    return config_from_dict(_merge(data, overrides or []), source=str(path or "defaults"))


def _merge(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, object]:
    """TOML sections with the overrides merged in, so that both are validated together."""
    for section, values in _parse_overrides(list(overrides)).items():
        if isinstance(data.setdefault(section, {}), dict):  # else config_from_dict says so
            data[section].update(values)
    return data


def _parse_overrides(overrides: list[str]) -> dict[str, dict[str, object]]:
    """``section.key=value`` strings as section -> key -> typed value (a later one wins)."""
    changes: dict[str, dict[str, object]] = {}
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
                lines.append(
                    f"{key} = [{', '.join(repr(str(v)).replace(chr(39), chr(34)) for v in value)}]"
                )
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


def split_tables(data: dict[str, Any], *, source: str = "config") -> dict[str, dict[str, object]]:
    """Take the experiment tables (``[protocol]``, ``[study]``, ``[tune]``: settings of the
    commands, not of one run) out of a parsed file, after checking each against its schema
    (:mod:`dpgrpo.config.experiments`): every key known and every value of its type, wherever
    the file is read. Returns table name -> its raw dict (the command that runs it builds the
    settings, with its CLI options over the table)."""
    tables = {name: data.pop(name) for name in EXPERIMENT_TABLES if name in data}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        if name == "tune" and "proxy" not in table:
            _settings(TuneSettings, name, table, {"proxy": "-"}, source)  # --proxy comes later
        else:
            _LOADERS[name](table, source=source)
    return tables


def _recipes(table: object, where: str) -> dict[str, dict[str, object]]:
    """``[protocol.recipes.<arm>]`` tables, each a table of run-config overrides."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must hold one table per arm")
    return {arm: check_override_table(recipe, f"{where[:-1]}.{arm}]")
            for arm, recipe in table.items()}


def grid_points(table: object, where: str = "[tune.grid]") -> tuple[GridPoint, ...]:
    """``[tune.grid]``: point name -> a list of overrides, or a table of key = value."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table: point name -> overrides")
    points = []
    for name, value in table.items():
        if isinstance(value, dict):
            items = tuple(f"{k}={override_text(v)}" for k, v in _flatten("", value).items())
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            items = tuple(value)
        else:
            raise ConfigError(f"{where} {name!r} must be a list of \"section.key=value\" "
                              f"strings or a table, got {value!r}")
        try:
            _parse_overrides(list(items))
        except ConfigError as err:
            raise ConfigError(f"{where} {name!r}: {err}") from None
        points.append(GridPoint(name, items))
    return tuple(points)


#: keys of the experiment tables that are tables themselves, each with its reader
_SUBTABLES: dict[str, dict[str, Callable[[Any, str], Any]]] = {
    "protocol": {"recipes": _recipes},
    "study": {"leaky": check_override_table, "private_audit": check_override_table,
              "warm_start": check_override_table},
    "tune": {"grid": grid_points},
}


def _settings(cls: type[T], name: str, table: Mapping[str, object], options: Mapping[str, object],
              source: str, **extra: object) -> T:
    """Settings of the table ``[name]``: ``options`` (a command's typed options, None = not
    given) over the table, read by the one strict loader."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: [{name}] must be a table")
    values = {**table, **{k: v for k, v in options.items() if v is not None}}
    readers = _SUBTABLES.get(name, {})
    try:
        kwargs = {k: readers[k](v, f"[{name}.{k}]") if k in readers
                  else typed_value(cls, name, k, v) for k, v in values.items()}
        return cls(**{**kwargs, **extra})
    except DPGRPOError as err:
        raise type(err)(f"{source}: {err}") from None


def load_protocol_table(table: Mapping[str, object], *, source: str = "config",
                        **options: object) -> ProtocolSettings:
    """``[protocol]`` settings: ``options`` (CLI values; None = not given) over the table;
    the recipes of the table merged key by key over :data:`DEFAULT_RECIPES`."""
    recipes = {arm: dict(r) for arm, r in DEFAULT_RECIPES.items()}
    table = dict(table)
    try:
        for arm, recipe in _recipes(table.pop("recipes", {}), "[protocol.recipes]").items():
            recipes.setdefault(arm, {}).update(recipe)
    except DPGRPOError as err:
        raise type(err)(f"{source}: {err}") from None
    return _settings(ProtocolSettings, "protocol", table, options, source, recipes=recipes)


def load_study_table(table: Mapping[str, object], *, source: str = "config",
                     **options: object) -> StudySettings:
    """``[study]`` settings: ``options`` (None = not given) over the table."""
    return _settings(StudySettings, "study", table, options, source)


def load_tune_table(table: Mapping[str, object], *, source: str = "config",
                    **options: object) -> TuneSettings:
    """``[tune]`` settings: ``options`` (CLI values; None = not given) over the table."""
    if not table.get("proxy") and not options.get("proxy"):
        raise ConfigError(f"{source}: name a public proxy task with --proxy or tune.proxy")
    return _settings(TuneSettings, "tune", table, options, source)


_LOADERS: dict[str, Callable[..., Any]] = {"protocol": load_protocol_table,
                                           "study": load_study_table, "tune": load_tune_table}


def load_protocol_config(path: str | Path | None, overrides: Sequence[str] = ()
                         ) -> tuple[RunConfig, dict[str, object]]:
    """A training config and its ``[protocol]`` table (:mod:`dpgrpo.experiments.protocol`; stripped,
    like ``[study]``, before the RunConfig is built).

    ``path`` None: the embedded CPU demo. Overrides are ``section.key=value`` strings.
    """
    if path is None:
        return apply_overrides(embedded_default(), list(overrides)), {}
    path = Path(path)
    data = read_toml(path)
    table = split_tables(data, source=str(path)).get("protocol", {})  # checked, with the file
    return config_from_dict(_merge(data, overrides), source=str(path)), table
