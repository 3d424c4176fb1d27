"""The vLLM engine: its plumbing against a fake ``vllm`` module (requests, per-request seeds,
isolated calls, adapter sync, output format), and its contract against real vLLM, which runs
only where vLLM and a CUDA GPU are present (skipped elsewhere; it has never run here)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.rollout import make_engine
from dpgrpo.rollout.batch import chat_prompt_ids
from dpgrpo.rollout.engine import request_seed
from dpgrpo.verify.fixtures import tiny_fp64_policy

MSGS = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more. How many are there now?",
        "Add 5 and 9."]


@dataclass
class FakeParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list = field(default_factory=list)
    detokenize: bool = True


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeLLM:
    """Deterministic stand-in: tokens from (prompt, seed, adapter id); some rows end with a
    stop id that vLLM reports (kept), others with one it dropped (finish_reason 'stop')."""

    def __init__(self, eos: int, vocab: int) -> None:
        self.eos, self.vocab, self.calls, self.reasons = eos, vocab, [], []

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params, lora_request))
        outputs = []
        for prompt, p in zip(prompts, params):
            salt = sum(prompt["prompt_token_ids"]) + p.seed + 7 * (lora_request.lora_int_id
                                                                   if lora_request else 0)
            length = 1 + salt % (p.max_tokens + 2)              # > max_tokens: hits the cap
            ids = [3 + (salt * (k + 1)) % (self.vocab - 3) for k in range(min(length,
                                                                             p.max_tokens))]
            ids = [i if i != self.eos else 4 for i in ids]
            reason = "length"
            if length <= p.max_tokens:
                reason = "stop"
                if salt % 2:
                    ids[-1] = self.eos                           # stop id reported
                else:
                    ids = ids[:-1]                               # stop id dropped
            self.reasons.append(reason)
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=ids, finish_reason=reason)]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.SamplingParams, vllm.LLM = FakeParams, None
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    return vllm


@pytest.fixture(scope="module")
def policy():
    return tiny_fp64_policy()


def _engine(policy, **kw):
    model, tok = policy
    llm = FakeLLM(tok.eos_token_id, len(tok))
    return make_engine("vllm", model, tok, model_name="unused", llm=llm, **kw), llm


def test_requests_seeds_and_format(fake_vllm, policy, check_rollouts):
    _, tok = policy
    engine, llm = _engine(policy)
    ro = engine.generate(MSGS, group_size=4, temperature=0.7, max_new_tokens=9,
                         seeds=[100, 200, 300])
    check_rollouts(ro, tok, 9)
    assert int(ro.hit_cap.sum()) == llm.reasons.count("length") >= 1   # stopped rows end
    assert llm.reasons.count("stop") >= 1
    (prompts, params, lora), = llm.calls                  # batched: one call, all rows
    ids = chat_prompt_ids(tok, MSGS)
    sent = [(tuple(q["prompt_token_ids"]), p.seed) for q, p in zip(prompts, params)]
    assert sorted(sent) == sorted((tuple(ids[i]), request_seed(s, j))
                                  for i, s in enumerate((100, 200, 300)) for j in range(4))
    assert len({p.seed for p in params}) == 12 and all(0 <= p.seed < 2**63 for p in params)
    assert [len(q[0]) for q in sent] == sorted(len(q[0]) for q in sent)   # sorted by length
    assert all(p.max_tokens == 9 and p.temperature == 0.7 and not p.detokenize
               and tok.eos_token_id in p.stop_token_ids for p in params)
    assert lora.lora_int_id == 1
    again = _engine(policy)[0].generate(MSGS, group_size=4, temperature=0.7, max_new_tokens=9,
                                        seeds=[100, 200, 300])
    assert torch.equal(again.input_ids, ro.input_ids)     # the seeds fix the completions


def test_isolated_calls_and_bounded_batches(fake_vllm, policy):
    kw = dict(group_size=2, temperature=1.0, max_new_tokens=5, seeds=[1, 2, 3])
    engine, llm = _engine(policy, isolated=True)
    engine.generate(MSGS, **kw)
    assert [len(prompts) for prompts, _, _ in llm.calls] == [2, 2, 2]
    assert all(len({tuple(p["prompt_token_ids"]) for p in prompts}) == 1
               for prompts, _, _ in llm.calls)
    engine, llm = _engine(policy, rows_per_call=4)
    engine.generate(MSGS, **kw)
    assert [len(prompts) for prompts, _, _ in llm.calls] == [4, 2]


def test_adapter_synced_only_when_it_changed(fake_vllm, policy):
    model, _ = policy
    engine, llm = _engine(policy)
    kw = dict(group_size=1, temperature=1.0, max_new_tokens=4, seeds=[1, 2, 3])
    engine.generate(MSGS, **kw)
    engine.generate(MSGS, **kw)
    first, second = llm.calls[0][2], llm.calls[1][2]
    assert second is first                                   # unchanged weights: no re-save
    lora_param = next(p for n, p in model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        lora_param.add_(0.01)
    try:
        engine.generate(MSGS, **kw)
        third = llm.calls[2][2]
        assert third.lora_int_id == 2 and third.lora_path != first.lora_path
        assert (Path(third.lora_path) / "adapter_config.json").exists()
        assert not Path(first.lora_path).exists()            # the stale adapter is removed
        assert (Path(third.lora_path).parent.stat().st_mode & 0o777) == 0o700
        engine.generate(MSGS, use_adapter=False, **kw)
        assert llm.calls[3][2] is None                       # the base policy: no adapter
    finally:
        with torch.no_grad():
            lora_param.sub_(0.01)


def test_vllm_refused_where_it_cannot_run(monkeypatch, policy):
    from dpgrpo.rollout import vllm_engine

    monkeypatch.setitem(sys.modules, "vllm", None)           # import vllm would fail
    with pytest.raises(ConfigError, match=r"dpgrpo\[vllm\]"):
        make_engine("vllm", *policy, model_name="x")
    monkeypatch.delitem(sys.modules, "vllm")
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    with pytest.raises(ConfigError, match="CUDA"):
        vllm_engine.require_vllm("cpu")


def _real_vllm_and_gpu() -> bool:
    from dpgrpo.rollout.vllm_engine import vllm_available

    return vllm_available() and torch.cuda.is_available()


@pytest.mark.slow
@pytest.mark.skipif(not _real_vllm_and_gpu(), reason="needs vLLM and a CUDA GPU")
def test_contract_with_real_vllm(check_rollouts):
    """Real vLLM on SmolLM2-135M with a LoRA adapter: the same format as the transformers
    engine, reproducible per seed, isolated completions independent of batch-mates, greedy
    first tokens equal to the transformers engine's, and adapter changes reach vLLM."""
    from dpgrpo.model import LoraSettings, load_policy

    policy = load_policy("smollm2-135m", lora=LoraSettings(), dtype="float32", device="cuda")
    model, tok = policy.model, policy.tokenizer
    engine = make_engine("vllm", model, tok, model_name="smollm2-135m", isolated=True,
                         dtype="float32")
    kw = dict(group_size=4, temperature=0.7, max_new_tokens=32)
    ro = engine.generate(MSGS, seeds=[1, 2, 3], **kw)
    check_rollouts(ro, tok, 32)
    assert torch.equal(engine.generate(MSGS, seeds=[1, 2, 3], **kw).input_ids, ro.input_ids)
    alone = engine.generate(MSGS[:1], seeds=[1], **kw)
    assert alone.texts[0] == ro.texts[0]
    greedy = dict(group_size=1, temperature=0.0, max_new_tokens=4)
    hf = make_engine("transformers", model, tok).generate(MSGS, **greedy)
    vl = engine.generate(MSGS, **greedy)
    width = hf.input_ids.shape[1] - 4
    assert torch.equal(vl.input_ids[:, width], hf.input_ids[:, width])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert engine.generate(MSGS, **greedy).texts != vl.texts
