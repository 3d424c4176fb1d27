"""Every table a user writes has one strict schema (issue 59): the experiment tables
([protocol], [study], [tune]) are read by the run config's loader, so a value of the wrong type
is refused with the file, the table and the key instead of being taken as true, accepted as nan,
or ending in a traceback."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from dpgrpo.config import load_config, load_protocol_config
from dpgrpo.config import loading as loading_module
from dpgrpo.config.arms import ARM_NAMES, ARMS
from dpgrpo.config.experiments import ProtocolSettings, StudySettings, TuneSettings
from dpgrpo.config.loading import load_study_table, load_tune_table, read_toml, split_tables
from dpgrpo.config.losses import LOSS_TYPES, SCALE_REWARDS, LossType, ScaleRewards
from dpgrpo.config.schema import (
    INIT_KEEP,
    KL_REFERENCE,
    LORA_TRAIN,
    InitKeep,
    KLReference,
    LoraTrain,
)
from dpgrpo.errors import ConfigError
from dpgrpo.experiments.tune import load_tune

ROOT = Path(__file__).resolve().parents[2]

#: the values issue 59 found taken as true, accepted, or ending in a traceback
BAD = [
    ("protocol", 'ladder = "false"', r"'protocol\.ladder' expects true or false, got 'false'"),
    ("protocol", "non_private = 1", r"'protocol\.non_private' expects true or false, got 1"),
    ("protocol", 'figures = "no"', r"'protocol\.figures' expects true or false, got 'no'"),
    ("protocol", "draws = nan", r"'protocol\.draws' expects an integer, got nan"),
    ("protocol", "seeds = 2.5", r"'protocol\.seeds' expects an integer, got 2\.5"),
    ("study", "sweep = [inf]", r"'study\.sweep' must be finite numbers, got \(inf,\)"),
    ("study", 'sweep = ["a"]', r"'study\.sweep' expects a list of numbers, got \['a'\]"),
    ("study", "audit_temperature = nan", r"'study\.audit_temperature' must be a finite number"),
    ("tune", 'workers = "2"', r"'tune\.workers' expects an integer, got '2'"),
]


def _file(tmp_path: Path, table: str, line: str) -> Path:
    path = tmp_path / "exp.toml"
    proxy = 'proxy = "arithmetic-2"\n' if table == "tune" and "proxy" not in line else ""
    path.write_text(f"[train]\nrounds = 2\n\n[{table}]\n{proxy}{line}\n", encoding="utf-8")
    return path


def _command_loader(table: str, path: Path) -> object:
    """What `dpgrpo protocol`, `study` and `tune` call on the file."""
    if table == "protocol":
        return load_protocol_config(path)
    if table == "tune":
        return load_tune(path)
    data = read_toml(path)
    return load_study_table(split_tables(data, source=str(path))["study"], source=str(path))


@pytest.mark.parametrize(("table", "line", "message"), BAD)
def test_a_wrong_type_in_an_experiment_table_names_the_file_table_and_key(
        tmp_path, table, line, message):
    path = _file(tmp_path, table, line)
    with pytest.raises(ConfigError, match=message) as caught:
        _command_loader(table, path)
    assert str(caught.value).startswith(f"{path}: ")
    # every reader of the file checks the tables, `dpgrpo train` too
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_command_options_go_through_the_same_loader(tmp_path):
    path = _file(tmp_path, "tune", "seeds = 2")
    _, settings = load_tune(path, workers=3)
    assert (settings.workers, settings.seeds, settings.proxy) == (3, 2, "arithmetic-2")
    with pytest.raises(ConfigError, match=r"'tune\.workers' expects an integer, got 2\.0"):
        load_tune(path, workers=2.0)
    with pytest.raises(ConfigError, match=r"unknown key 'tune\.wrokers'"):
        load_tune_table({"proxy": "x", "wrokers": 2})
    with pytest.raises(ConfigError, match="name a public proxy task"):
        load_tune_table({})


def test_choices_are_one_table_or_literal_each():
    assert tuple(ARMS) == ARM_NAMES
    for literal, table in ((LossType, LOSS_TYPES), (ScaleRewards, SCALE_REWARDS),
                           (LoraTrain, LORA_TRAIN), (InitKeep, INIT_KEEP),
                           (KLReference, KL_REFERENCE)):
        assert typing.get_args(literal) == tuple(table)


@pytest.mark.parametrize(("text", "message"), [
    ('[protocol]\narms = ["dp-grpo", "dp-sgd"]', r"unknown protocol arm 'dp-sgd'"),
    ('[train]\nrollout_engine = "tgi"',
     r"train\.rollout_engine must be one of transformers, vllm; got 'tgi'"),
    ('[train]\nloss_type = "dapo"', r"cannot hold under prompt-level DP"),
    ('[train]\nmetrics = ["jsonl", "csv"]',
     r"train\.metrics must be one of jsonl, tensorboard, wandb; got 'csv'"),
    ('[protocol.recipes.gold-sft]\n"train.learning_rate" = "fast"',
     r"\[protocol\.recipes\.gold-sft\]: 'train\.learning_rate' expects a number, got 'fast'"),
    ('[protocol.recipes.gold-sft]\n"train.lerning_rate" = 1e-5',
     r"\[protocol\.recipes\.gold-sft\]: unknown key 'train\.lerning_rate'"),
    ('[study.leaky]\n"train.rounds" = 2.5',
     r"\[study\.leaky\]: 'train\.rounds' expects an integer, got '2\.5'"),
    ('[tune.grid]\nsmall = [1]', r"\[tune\.grid\] 'small' must be a list of"),
    ('[tune.grid]\nsmall = ["model.lora_rank=two"]', r"\[tune\.grid\] 'small': 'model\.lora_rank'"),
    ("[study]\nleaky = 3", r"\[study\.leaky\] must be a table"),
    ("protocol = 3", r"\[protocol\] must be a table"),
])
def test_choices_subtables_and_overrides_are_typed_too(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_the_shipped_study_config_loads_through_every_table():
    path = ROOT / "configs" / "cpu-study.toml"
    data = read_toml(path)
    tables = split_tables(data, source=str(path))
    assert set(tables) == {"protocol", "study", "tune"}
    study = load_study_table(tables["study"], source=str(path))
    assert study.sweep == (32.0, 128.0, 1024.0) and study.workers == 2
    assert study.leaky["train.rounds"] == 20
    _, table = load_protocol_config(path)
    assert table["arms"] == ["dp-grpo", "zero-advantage"]
    assert isinstance(study, StudySettings)
    assert ProtocolSettings().draws > 0 and TuneSettings(proxy="p").seeds == 1


def test_the_check_is_what_refuses_them(tmp_path, monkeypatch):
    """With the loader's typing bypassed (a value taken as it comes, as before issue 59), the
    string "false" reaches the settings and is truthy: the protocol would run the ladder."""
    monkeypatch.setattr(loading_module, "parse_value", lambda base, value, text: value)
    path = _file(tmp_path, "protocol", 'ladder = "false"')
    _, table = load_protocol_config(path)
    settings = loading_module.load_protocol_table(table)
    assert settings.ladder == "false" and len(settings.all_arms()) == 6
