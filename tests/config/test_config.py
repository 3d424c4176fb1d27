"""Run configuration: TOML, typed overrides, and clear errors for bad configs."""

from __future__ import annotations

import pytest

from dpgrpo.config import RunConfig, apply_overrides, embedded_default, load_config, to_toml
from dpgrpo.errors import ConfigError, PrivacyBudgetError


def test_toml_round_trip_and_typed_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(to_toml(embedded_default()))
    cfg = load_config(path, ["privacy.epsilon=4", "train.rounds=7", "train.clip_nonprivate=false",
                             "model.target_modules=q_proj,v_proj", "privacy.delta=none"])
    assert cfg.privacy.epsilon == 4.0
    assert isinstance(cfg.train.rounds, int) and cfg.train.rounds == 7
    assert cfg.train.clip_nonprivate is False and cfg.model.target_modules == ("q_proj", "v_proj")
    assert cfg.model.name == "smollm2-135m" and cfg.privacy.delta is None


@pytest.mark.parametrize("override,needle", [
    ("privacy.epsilonn=3", "privacy.epsilonn"),
    ("trian.rounds=3", "trian"),
    ("train.rounds=three", "train.rounds"),
    ("train.arm=dp-sgd", "train.arm"),
    ("privacy.clip_norm=0", "clip_norm"),
    ("model.dtype=int8", "model.dtype"),
    ("train.rollout_engine=llama.cpp", "train.rollout_engine"),
    ("rounds=3", "section.key=value"),
])
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        apply_overrides(RunConfig(), [override])


def test_inconsistent_values_rejected(tmp_path):
    with pytest.raises(ConfigError, match="non-private"):
        apply_overrides(RunConfig(), ["privacy.noise_multiplier=1.0", "train.arm=non-private"])
    with pytest.raises(ConfigError, match="private"):
        apply_overrides(RunConfig(), ["privacy.noise_multiplier=0"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nrounds = 3\n[optimizer]\nlr = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[optimizer\]"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_public_dict_hides_the_seed():
    cfg = apply_overrides(RunConfig(), ["privacy.seed=1234"])
    public = cfg.to_dict(public=True)
    assert public["privacy"]["seeded"] is True and "seed" not in public["privacy"]
    assert cfg.to_dict(public=False)["privacy"]["seed"] == 1234


def test_paper_presets_load():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "configs"
    from dpgrpo.config.loading import EMBEDDED_DEFAULT

    for path in (configs / "math.toml", configs / "gsm8k.toml", configs / "csqa.toml",
                 EMBEDDED_DEFAULT):
        cfg = load_config(path)
        assert cfg.train.arm == "dp-grpo"
    math_cfg = load_config(configs / "math.toml")
    assert (math_cfg.train.rounds, math_cfg.privacy.expected_batch,
            math_cfg.train.group_size) == (50, 128, 8)
    assert math_cfg.privacy.clip_norm == pytest.approx(0.05536)


def test_group_sizes_are_public_validated_integers(tmp_path):
    assert embedded_default().privacy.group_sizes == (2, 3)
    cfg = apply_overrides(embedded_default(), ["privacy.group_sizes=2, 5,8"])
    assert cfg.privacy.group_sizes == (2, 5, 8)
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert "group_sizes = [2, 5, 8]" in path.read_text()
    assert load_config(path).privacy.group_sizes == (2, 5, 8)
    assert apply_overrides(cfg, ["privacy.group_sizes="]).privacy.group_sizes == ()
    for bad in ("1", "2,2", "9", "two", "2.5", "0"):
        with pytest.raises(ConfigError, match="group_sizes"):
            apply_overrides(cfg, [f"privacy.group_sizes={bad}"])
    path.write_text("[privacy]\ngroup_sizes = [true]\n")
    with pytest.raises(ConfigError, match="group_sizes"):
        load_config(path)


@pytest.mark.parametrize("toml,key", [
    ("[train]\nrounds = true", "train.rounds"),            # a TOML boolean is not a number
    ("[privacy]\nepsilon = true", "privacy.epsilon"),    # (it once certified epsilon = 1)
    ("[train]\nrounds = 2.0", "train.rounds"),             # no float where an int is meant
    ('[privacy]\nepsilon = "8"', "privacy.epsilon"),     # a number is not a string
    ("[model]\nname = 1", "model.name"),                 # ... nor a string a number
    ("[train]\nclip_nonprivate = 1", "train.clip_nonprivate"),
    ("[train]\nlearning_rate = inf", "train.learning_rate"),
    ("[train]\nlearning_rate = nan", "train.learning_rate"),
    ("[train]\nbeta = inf", "train.beta"),
    ("[train]\nbeta = -0.1", "train.beta"),
    ("[train]\ntemperature = inf", "train.temperature"),
    ("[train]\ntemperature = 0.0", "train.temperature"),
    ("[train]\nmax_new_tokens = 0", "train.max_new_tokens"),
    ("[privacy]\nseed = -1", "privacy.seed"),
    ("[privacy]\nepsilon = -1.0", "privacy.epsilon"),
    ("[privacy]\nnoise_multiplier = 1e-9", "privacy.noise_multiplier"),
    ("[audit]\ncanaries = -1", "audit.canaries"),
    ("[audit]\ncanary_seed = -2", "audit.canary_seed"),
    ("[model]\nlora_dropout = 1.0", "model.lora_dropout"),
])
def test_toml_values_are_typed_strictly_and_range_checked(tmp_path, toml, key):
    from dpgrpo.errors import DPGRPOError

    path = tmp_path / "c.toml"
    path.write_text(toml + "\n")
    with pytest.raises(DPGRPOError) as info:
        load_config(path)
    message = str(info.value)
    assert key in message and str(path) in message and "\n" not in message


@pytest.mark.parametrize("override,key", [
    ("train.rounds=2.0", "train.rounds"), ("train.rounds=true", "train.rounds"),
    ("train.learning_rate=inf", "train.learning_rate"), ("privacy.seed=-3", "privacy.seed"),
    ("train.clip_nonprivate=maybe", "train.clip_nonprivate"),
    ("privacy.noise_multiplier=1e-3", "privacy.noise_multiplier"),
])
def test_override_text_is_parsed_by_the_field_type(override, key):
    from dpgrpo.errors import DPGRPOError

    with pytest.raises(DPGRPOError, match=key.replace(".", r"\.")):
        apply_overrides(RunConfig(), [override])


def test_integers_stay_integers_and_ints_are_numbers(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nrounds = 3\nlearning_rate = 1\n[privacy]\nepsilon = 4\n")
    cfg = load_config(path)
    assert cfg.train.rounds == 3 and type(cfg.train.rounds) is int
    assert cfg.privacy.epsilon == 4.0 and type(cfg.privacy.epsilon) is float
    assert type(cfg.train.learning_rate) is float


def test_sigma_floor_is_where_the_accountant_grid_explodes():
    from dpgrpo.config.sigma_floor import MAX_PLD_POINTS, min_sigma, pld_grid_points

    floor = min_sigma()
    assert pld_grid_points(floor) == pytest.approx(MAX_PLD_POINTS, rel=1e-6)
    assert pld_grid_points(1e-3) * 8 / 2 ** 30 > 30  # the 38 GiB the issue measured
    apply_overrides(RunConfig(), [f"privacy.noise_multiplier={floor * 1.01}"])  # accepted


def test_the_sigma_floor_is_one_function_in_config_and_in_privacy():
    # config/ owns it (checked at load, below privacy/); privacy.limits re-exports the same names
    import dpgrpo.config.sigma_floor as config_floor
    import dpgrpo.privacy.limits as privacy_floor

    for name in privacy_floor.__all__:
        assert getattr(privacy_floor, name) is getattr(config_floor, name)
    with pytest.raises(PrivacyBudgetError, match=r"privacy\.noise_multiplier"):
        apply_overrides(RunConfig(), [f"privacy.noise_multiplier={config_floor.min_sigma() / 2}"])


def test_non_utf8_toml_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[model]\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_one_setting_sizes_a_pass():
    """train.rows_per_pass (rows of one prompt per training/reference pass), else the token
    budget train.max_tokens_per_pass over the completion cap; the old name is refused."""
    from dpgrpo.config import TrainConfig

    assert TrainConfig().pass_rows(48) == 512 // 48
    assert TrainConfig(max_tokens_per_pass=64).pass_rows(48) == 1
    assert TrainConfig(rows_per_pass=3).pass_rows(48) == 3
    with pytest.raises(ConfigError, match="rows_per_pass must be >= 1"):
        TrainConfig(rows_per_pass=0)
    with pytest.raises(ConfigError, match=r"unknown key 'train.chunk_size'"):
        load_config(None, ["train.chunk_size=2"])


def test_the_old_name_of_train_rounds_is_refused_with_the_new_one(tmp_path):
    """T is train.rounds; train.steps (0.2.0) in a config file, an override or a dict is a
    ConfigError naming the new key, never an alias (a saved run directory is read by
    rundir.resume.as_written instead)."""
    from dpgrpo.config import config_from_dict

    path = tmp_path / "old.toml"
    path.write_text("[train]\nsteps = 3\n")
    renamed = r"train\.steps was renamed train\.rounds"
    with pytest.raises(ConfigError, match=renamed) as info:
        load_config(path)
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError, match=renamed):
        load_config(None, ["train.steps=3"])
    with pytest.raises(ConfigError, match=renamed):
        apply_overrides(RunConfig(), ["train.steps=3"])
    with pytest.raises(ConfigError, match=renamed):
        config_from_dict({"train": {"steps": 3}})
    assert load_config(None, ["train.rounds=3"]).train.rounds == 3
