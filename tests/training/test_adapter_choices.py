"""Smaller private parameter spaces and public warm starts (issue 26): model.lora_train
("all", "B" = FFA-LoRA, "bias"), model.lora_bias and model.init_adapter.

Each option keeps the per-prompt gradient paths exact (fast = reference), keeps what it
freezes frozen through training and resume, and is stated in the certificate."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from test_grads import make_batch, make_rollouts

from dpgrpo import model_adapters
from dpgrpo.config import ModelConfig, load_config
from dpgrpo.errors import ConfigError
from dpgrpo.model import LoraSettings, adapter_parameters, attach_lora
from dpgrpo.objectives.grpo import GRPOObjective
from dpgrpo.rollout.transformers_engine import merged_adapter
from dpgrpo.rundir.checkpoint import restore_adapter, save_recovery
from dpgrpo.training.grads import (
    per_prompt_grads_fast,
    per_prompt_grads_reference,
    trainable_parameters,
)
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer, exact_rmsnorm

REWARDS = torch.tensor([[1., 0, 0, 1], [0, 0, 0, 1], [1, 1, 0, 0]])


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _policy(tok, train: str = "all", bias: bool = False, seed: int = 7):
    """fp64 tiny Llama whose adapter weights (A, B and B's bias) are all nonzero."""
    torch.manual_seed(seed)
    base = build_tiny_model(tok, dtype="float64")
    exact_rmsnorm(base)
    model = attach_lora(base, LoraSettings(dropout=0.0, train=train, bias=bias))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter_parameters(model).items():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    return model.eval()


@pytest.mark.parametrize("train,bias,suffixes", [
    ("B", False, ("lora_B.default.weight",)),
    ("B", True, ("lora_B.default.weight", "lora_B.default.bias")),
    ("bias", True, ("lora_B.default.bias",)),
])
def test_frozen_parts_leave_the_per_prompt_gradients_exact(tok, train, bias, suffixes):
    model = _policy(tok, train, bias)
    params = trainable_parameters(model)
    assert params and all(n.endswith(suffixes) for n in params)
    # one function: model_adapters' (the checkpoints restore these), re-exported by grads
    assert trainable_parameters is model_adapters.trainable_parameters
    frozen = [n for n, p in adapter_parameters(model).items() if not p.requires_grad]
    assert frozen and all("lora_A" in n or n.endswith("lora_B.default.weight") for n in frozen)
    batch = make_batch(model, tok, REWARDS)      # the reference pass switches PEFT's adapter
    assert set(trainable_parameters(model)) == set(params)  # off and on: the freeze holds
    assert not any(adapter_parameters(model)[n].requires_grad for n in frozen)
    fast = per_prompt_grads_fast(model, GRPOObjective(), batch)
    ref = per_prompt_grads_reference(model, GRPOObjective(), batch)
    assert set(fast) == set(ref) == set(params)
    for name in params:
        scale = float(ref[name].abs().max())
        assert scale > 0 and float((fast[name] - ref[name]).abs().max()) <= 1e-9 * scale
    # freezing A does not change dL/dB: the same weights trained whole give the same B grads
    whole = _policy(tok, "all", bias)
    full = per_prompt_grads_reference(whole, GRPOObjective(), make_batch(whole, tok, REWARDS))
    for name in params:
        assert torch.allclose(full[name], ref[name], rtol=1e-9, atol=1e-12), name


def test_the_parameter_count_falls_as_the_issue_says(tok):
    counts = {train: sum(p.numel()
                         for p in trainable_parameters(_policy(tok, train, True)).values())
              for train in ("all", "B", "bias")}
    model = _policy(tok, "all", True)
    d_out = sum(m.out_features for n, m in model.named_modules() if n.endswith("lora_B.default"))
    assert counts["bias"] == d_out                      # one vector of d_out per module
    rank = LoraSettings().rank
    assert counts["B"] == (rank + 1) * d_out            # weight (d_out x rank) + bias
    assert counts["all"] > counts["B"] > counts["bias"]


def test_the_cpu_decoder_merges_the_lora_bias(tok):
    model = _policy(tok, "bias", True)
    ids = torch.randint(3, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with merged_adapter(model):
            merged = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert float((plain - merged).abs().max()) < 1e-10       # the bias is in the merge
    assert torch.equal(plain, after)                         # and leaving restores the layer
    assert float((plain - base).abs().max()) > 1e-3          # the bias does move the logits


def test_resume_restores_a_frozen_A(tok, tmp_path):
    model = _policy(tok, "B", seed=1)
    opt = torch.optim.AdamW(list(trainable_parameters(model).values()), lr=1e-3)
    path = save_recovery(tmp_path / "recovery", 3, model=model, optimizer=opt, generators={},
                         extra={})
    other = _policy(tok, "B", seed=2)                        # another random A
    a_name = next(n for n in adapter_parameters(other) if "lora_A" in n)
    assert not torch.equal(adapter_parameters(other)[a_name], adapter_parameters(model)[a_name])
    restore_adapter(other, torch.load(path / "state.pt", weights_only=False)["adapter"])
    for name, p in adapter_parameters(model).items():
        assert torch.equal(adapter_parameters(other)[name], p), name
    assert not adapter_parameters(other)[a_name].requires_grad


def _save_adapter(tok, folder: Path, **lora) -> Path:
    model = _policy(tok, **lora)
    model.save_pretrained(folder)
    return folder


def test_init_adapter_loads_every_weight_or_refuses(tok, tmp_path):
    saved = _save_adapter(tok, tmp_path / "public", seed=3)
    source = {n: p.detach().clone() for n, p in adapter_parameters(_policy(tok, seed=3)).items()}
    base = build_tiny_model(tok, dtype="float64")
    warm = attach_lora(base, LoraSettings(dropout=0.0, train="B", init_adapter=str(saved)))
    for name, p in adapter_parameters(warm).items():
        assert torch.equal(p.detach(), source[name]), name
    assert all("lora_B" in n for n in trainable_parameters(warm))
    with pytest.raises(ConfigError, match=r"does not fit|tensors for an adapter"):
        attach_lora(build_tiny_model(tok, dtype="float64"),
                    LoraSettings(rank=2, init_adapter=str(saved)))
    with pytest.raises(ConfigError, match="tensors for an adapter"):
        attach_lora(build_tiny_model(tok, dtype="float64"),
                    LoraSettings(bias=True, init_adapter=str(saved)))
    with pytest.raises(ConfigError, match="not found"):
        attach_lora(build_tiny_model(tok, dtype="float64"),
                    LoraSettings(init_adapter=str(tmp_path / "nowhere")))


def test_keeping_the_public_a_starts_at_the_base_model(tok, tmp_path):
    """init_adapter_keep = "A": every lora_A weight is the public adapter's, every lora_B is
    zero, so the warm-started model computes exactly what the base model does; with
    lora_train = "B" only lora_B trains, inside the public projections."""
    saved = _save_adapter(tok, tmp_path / "public", seed=3)
    source = {n: p.detach().clone() for n, p in adapter_parameters(_policy(tok, seed=3)).items()}
    warm = attach_lora(build_tiny_model(tok, dtype="float64"),
                       LoraSettings(dropout=0.0, train="B", init_adapter=str(saved),
                                    init_keep="A"))
    for name, p in adapter_parameters(warm).items():
        if ".lora_A." in name:
            assert torch.equal(p.detach(), source[name]) and p.abs().sum() > 0, name
        else:
            assert not p.detach().any(), name
    assert all("lora_B" in n for n in trainable_parameters(warm))
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        logits = warm(input_ids=ids).logits
        with warm.disable_adapter():
            assert torch.equal(logits, warm(input_ids=ids).logits)
    with pytest.raises(ConfigError, match="init_adapter_keep must be one of"):
        ModelConfig(init_adapter=str(saved), init_adapter_keep="B")
    with pytest.raises(ConfigError, match=r"set model.init_adapter"):
        ModelConfig(init_adapter_keep="A")


def _own_logprobs(model, rollouts):
    """The policy's own token log-probs (adapter on), as the loss's ratio sees them."""
    from dpgrpo.objectives.logprobs import token_logprobs

    with torch.no_grad():
        return token_logprobs(model, rollouts.input_ids, rollouts.attention_mask,
                              mask=rollouts.completion_mask, group_size=rollouts.group_size)


def test_the_kl_reference_is_the_warm_start_unless_the_base_is_asked_for(tok, tmp_path):
    """model.kl_reference = "start" (default): from a warm start, pi_ref is the warm-started
    policy, so the KL term is zero at round 0 and stays anchored there as the adapter moves;
    the adapter gets its own weights back bit for bit, also when the pass fails. "base" (the
    adapter switched off, TRL's PEFT reference) pulls towards the base model instead. Without a
    warm start both are the base model (a fresh adapter's lora_B is zero)."""
    from dpgrpo.model import reference_policy
    from dpgrpo.objectives.grpo import reference_logprobs

    saved = _save_adapter(tok, tmp_path / "public", seed=3)
    rollouts = make_rollouts(tok, 2, 3, seed=1)
    warm = attach_lora(build_tiny_model(tok, dtype="float64"),
                       LoraSettings(dropout=0.0, init_adapter=str(saved))).eval()
    base = attach_lora(build_tiny_model(tok, dtype="float64"),
                       LoraSettings(dropout=0.0, init_adapter=str(saved),
                                    kl_reference="base")).eval()
    start = _own_logprobs(warm, rollouts)
    assert torch.equal(reference_logprobs(warm, rollouts), start)        # KL = 0 at round 0
    with torch.no_grad(), base.disable_adapter():
        off = _own_logprobs(base, rollouts)
    assert torch.equal(reference_logprobs(base, rollouts), off)
    assert float((start - off).abs().max()) > 1e-3                       # the two differ
    with torch.no_grad():                                                # training moves it
        for name, p in adapter_parameters(warm).items():
            p.add_(0.1 if "lora_B" in name else 0.0)
    moved = {n: p.detach().clone() for n, p in adapter_parameters(warm).items()}
    assert torch.equal(reference_logprobs(warm, rollouts), start)        # still the start
    assert all(torch.equal(p, moved[n]) for n, p in adapter_parameters(warm).items())
    assert float((_own_logprobs(warm, rollouts) - start).abs().max()) > 1e-3
    with pytest.raises(RuntimeError, match="mid-pass"), reference_policy(warm):
        raise RuntimeError("mid-pass")
    assert all(torch.equal(p, moved[n]) for n, p in adapter_parameters(warm).items())
    fresh = attach_lora(build_tiny_model(tok, dtype="float64"), LoraSettings(dropout=0.0))
    with torch.no_grad(), fresh.disable_adapter():
        plain = _own_logprobs(fresh, rollouts)
    assert torch.equal(reference_logprobs(fresh, rollouts), plain)
    assert torch.equal(_own_logprobs(fresh, rollouts), plain)            # B = 0: start = base
    with pytest.raises(ConfigError, match="kl_reference must be one of"):
        ModelConfig(kl_reference="warm")


def test_a_run_saved_before_kl_reference_resumes_with_its_old_reference(tmp_path):
    """A run directory written before ``model.kl_reference`` existed: a warm-started run had
    the adapter switched off as its reference, and resumes so; any other takes the default.
    Its ``train.chunk_size`` is read as ``train.rows_per_pass``."""
    from dpgrpo.config import config_from_dict
    from dpgrpo.experiments.protocol import check_run_dir
    from dpgrpo.rundir.layout import RunDir
    from dpgrpo.rundir.resume import read_run_config

    for init, expected in ((str(tmp_path / "public"), "base"), (None, "start")):
        run = tmp_path / f"run-{expected}"
        layout = RunDir(run)
        layout.config_json.parent.mkdir(parents=True)
        data = json.loads(json.dumps(config_from_dict({}).to_dict(public=False)))
        data["model"].pop("kl_reference")
        data["model"]["init_adapter"] = init
        data["train"].pop("rows_per_pass")
        data["train"]["chunk_size"] = 3                  # train.rows_per_pass's old name
        layout.config_json.write_text(json.dumps(data))
        assert read_run_config(run).model.kl_reference == expected
        assert read_run_config(run).train.rows_per_pass == 3
        new = config_from_dict({**data, "model": {**data["model"], "kl_reference": "start"},
                                "train": read_run_config(run).to_dict(public=False)["train"]})
        if expected == "base":      # a study with today's default does not resume it
            with pytest.raises(ConfigError, match=r"differs in model\.kl_reference"):
                check_run_dir(new, run)
        else:
            check_run_dir(new, run)


def test_config_checks_the_adapter_options():
    with pytest.raises(ConfigError, match="lora_train must be one of"):
        ModelConfig(lora_train="A")
    with pytest.raises(ConfigError, match="lora_bias = true"):
        ModelConfig(lora_train="bias")
    assert ModelConfig(lora_train="bias", lora_bias=True).lora_train == "bias"


def test_a_private_run_starts_from_the_public_adapter_and_says_so(tiny_model_dir, tmp_path):
    """One DP round from a warm start: every adapter weight starts at the public adapter's
    value (the first AdamW step moves each trained coordinate by at most lr, frozen ones not
    at all), and the certificate names the adapter, its sha256 and what was trained."""
    from dpgrpo.model import load_policy
    from dpgrpo.training.trainer import train

    public = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=1))
    with torch.no_grad():
        for name, p in adapter_parameters(public.model).items():
            p.add_(0.3 if "lora_B" in name else 0.0)
    public.model.save_pretrained(tmp_path / "public")
    start = {n: p.detach().clone().float() for n, p in adapter_parameters(public.model).items()}
    lr = 1e-4
    config = load_config(None, [f"model.name={tiny_model_dir}", "model.device=cpu",
                                "model.lora_rank=1", "model.lora_train=B",
                                f"model.init_adapter={tmp_path / 'public'}",
                                "data.limit=20", "privacy.expected_batch=4",
                                "privacy.noise_multiplier=1.0", "train.rounds=1",
                                "train.group_size=2", "train.max_new_tokens=4",
                                f"train.learning_rate={lr}", "train.checkpoint_every=1"])
    result = train(config, tmp_path / "run")
    from safetensors.torch import load_file

    released = load_file(str(result.release_dir / "adapter_model.safetensors"))
    assert len(released) == len(start)
    for name, value in released.items():
        key = next(k for k in start if k.replace(".default", "") == name)
        moved = float((value.float() - start[key]).abs().max())
        if "lora_A" in name:
            assert moved == 0.0, name                   # frozen at the public value
        else:
            assert moved <= lr * 1.001, name            # one AdamW step from the public value
    assert any(float(v.abs().max()) > 0.25 for k, v in released.items() if "lora_B" in k)
    cert = result.certificate
    digest = hashlib.sha256((tmp_path / "public" / "adapter_model.safetensors").read_bytes())
    assert cert["adapter"]["init_adapter"]["sha256"] == digest.hexdigest()
    assert cert["adapter"]["lora_train"] == "B"
    assert cert["adapter"]["kl_reference"] == "start"                # the warm start
    n_b = sum(v.numel() for k, v in released.items() if "lora_B" in k)
    assert cert["adapter"]["trainable_coordinates"] == cert["trainable_coordinates"] == n_b
    saved = json.loads((result.release_dir / "certificate.json").read_text())
    assert saved["adapter"] == json.loads(json.dumps(cert["adapter"]))
