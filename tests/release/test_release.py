"""Releases load everywhere PEFT adapters load, keep PEFT's model card metadata, are read in the
old layout too, and `dpgrpo push` uploads release/ only (mocked hub, no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from dpgrpo.errors import ReleaseError
from dpgrpo.release.files import RELEASE_FILES, eval_defaults, read_release_config
from dpgrpo.release.publish import push_release
from dpgrpo.release.write import write_release

CERT = {"epsilon": 3.5, "delta": 1e-5, "releasable": True, "model": "tiny", "arm": "dp-grpo",
        "n": 100, "rounds_charged": 4, "q": 0.04, "sigma": 1.2, "accountant": "PLD"}
CONFIG = {"model": {"name": "tiny", "dtype": "bfloat16", "device": "cpu"},
          "data": {"task": "arithmetic", "data_dir": None, "source": "local"},
          "train": {"arm": "dp-grpo"}}


@pytest.fixture(scope="module")
def release(tiny_model_dir, tmp_path_factory) -> Path:
    """A release of the tiny model with non-zero LoRA B, written by write_release."""
    from dpgrpo.model import LoraSettings, load_policy

    policy = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=2, dropout=0.0))
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    for peft_config in policy.model.peft_config.values():
        peft_config.base_model_name_or_path = str(tiny_model_dir)  # local: loads offline
    run = tmp_path_factory.mktemp("run")
    write_release(run / "release", model=policy.model, config=CONFIG, certificate=CERT)
    return run / "release"


def _logits(model, tiny_model_dir) -> torch.Tensor:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("What is 12 plus 30?",
                                                        return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def test_release_files_and_model_card(release):
    assert {p.name for p in release.iterdir()} == RELEASE_FILES
    assert not (release / "config.json").exists()  # transformers would read it as the model's
    assert json.loads((release / "dpgrpo_config.json").read_text()) == CONFIG
    from huggingface_hub.repocard import metadata_load

    meta = metadata_load(release / "README.md")
    base = json.loads((release / "adapter_config.json").read_text())["base_model_name_or_path"]
    # the base is a folder of this machine here (so that it loads offline): the card names no
    # path and no base_model (a hub id there: test_api's README example)
    assert "base_model" not in meta and meta["library_name"] == "peft"
    assert base not in (release / "README.md").read_text()
    assert meta["pipeline_tag"] == "text-generation"
    assert {"lora", "dpgrpo", "differential-privacy"} <= set(meta["tags"])
    body = (release / "README.md").read_text().split("---\n", 2)[2]
    assert "(3.50, 1e-05)-DP" in body and "Status: releasable" in body


def test_peft_auto_peft_and_auto_model_load_the_release(release, tiny_model_dir):
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = _logits(base, tiny_model_dir)
    loaded = [PeftModel.from_pretrained(base, str(release)),
              AutoPeftModelForCausalLM.from_pretrained(str(release)),
              AutoModelForCausalLM.from_pretrained(str(release))]  # peft integration
    outputs = [_logits(m, tiny_model_dir) for m in loaded]
    assert not torch.allclose(outputs[0], plain)  # the adapter is applied
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])


def test_old_releases_with_config_json_still_read(tmp_path):
    from dpgrpo.audit.pipeline import read_run

    old = tmp_path / "run" / "release"
    old.mkdir(parents=True)
    (old / "config.json").write_text(json.dumps(CONFIG))
    assert read_release_config(old) == CONFIG
    found = eval_defaults(tmp_path / "run")
    assert (found["model"], found["task"], found["dtype"], found["device"]) == (
        "tiny", "arithmetic", "bfloat16", "cpu")
    assert read_run(tmp_path / "run").model_name == "tiny"
    (old / "config.json").write_text(json.dumps({"model_type": "llama"}))  # a model's config
    with pytest.raises(Exception, match=r"no dpgrpo_config.json"):
        read_release_config(old)


class FakeApi:
    calls: ClassVar[list] = []

    def __init__(self, token=None):
        pass

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        FakeApi.calls.append(("upload_folder", kwargs))
        return type("Commit", (), {"commit_url": "https://hub.example/commit/1"})()


def test_push_uploads_release_only(release, tmp_path, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from dpgrpo.cli import app

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    FakeApi.calls = []
    run = tmp_path / "run"
    shutil.copytree(release, run / "release")
    (run / "recovery").mkdir()
    (run / "recovery" / "journal.jsonl").write_text("{}\n")
    out = CliRunner().invoke(app, ["push", str(run), "--repo-id", "me/dp", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["commit_url"] == "https://hub.example/commit/1"
    (_, repo, _), (_, upload) = FakeApi.calls
    assert repo == "me/dp" and upload["folder_path"] == str(run / "release")
    assert set(upload["allow_patterns"]) == RELEASE_FILES
    FakeApi.calls = []
    with pytest.raises(ReleaseError, match="recovery folder"):
        push_release(run / "recovery", "me/dp")
    (run / "release" / "state.pt").write_text("x")
    with pytest.raises(ReleaseError, match=r"may not hold.*state.pt"):
        push_release(run, "me/dp")
    (run / "release" / "state.pt").unlink()
    cert = json.loads((run / "release" / "certificate.json").read_text())
    cert.update(releasable=False, not_releasable_because="seeded generators")
    (run / "release" / "certificate.json").write_text(json.dumps(cert))
    with pytest.raises(ReleaseError, match=r"NOT releasable.*--force"):
        push_release(run, "me/dp")
    assert FakeApi.calls == []  # nothing was uploaded by a refused push
    assert push_release(run, "me/dp", force=True) == "https://hub.example/commit/1"
