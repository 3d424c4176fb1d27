"""Sampling with LoRA dropout on (``train.rollout_dropout``, issue 55's D1) and one dropout mask
per row in the gradient pass (``train.share_prompt_pass = false``, D2): dropout fires where it
should and nowhere else, its masks are bound to the prompt, and a private arm cannot share a
dropout stream between prompts."""

from __future__ import annotations

import pytest
import torch

from dpgrpo.config import config_from_dict
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.model_adapters import LoraSettings, attach_lora
from dpgrpo.objectives import window_logprobs
from dpgrpo.objectives.grpo import build_grpo_batch
from dpgrpo.rollout import make_engine
from dpgrpo.rollout.transformers_engine import _lora_dropouts, dropout_seed
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer, synthetic_rollouts

MSGS = ["What is 12 plus 30?", "Add 5 and 9.", "Tom has 3 apples and buys 4 more. How many?"]
G, CAP = 3, 6


def _policy(p: float):
    """A tiny fp32 Llama with a nonzero LoRA adapter whose dropout is ``p``, in eval mode."""
    tok = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = attach_lora(build_tiny_model(tok, dtype="float32"), LoraSettings(dropout=p))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 2.0)
    return model.eval(), tok


@pytest.fixture(scope="module")
def policy():
    return _policy(0.5)


def _count_fired(model) -> tuple[list[int], list]:
    """Forward hooks on the LoRA dropout modules counting calls made in train mode."""
    fired = [0]

    def hook(module, _args, _out):
        fired[0] += int(module.training)

    return fired, [m.register_forward_hook(hook) for m in _lora_dropouts(model)]


def _generate(policy, messages, seeds, *, dropout: bool, isolated: bool = True):
    model, tok = policy
    engine = make_engine("transformers", model, tok, isolated=isolated, sample_dropout=dropout)
    return engine.generate(messages, group_size=G, temperature=1.0, max_new_tokens=CAP,
                           seeds=seeds)


def test_dropout_fires_on_every_decoded_token_only_when_asked(policy):
    model, _ = policy
    assert len(_lora_dropouts(model)) > 0
    fired, handles = _count_fired(model)
    try:
        _generate(policy, MSGS[:1], [11], dropout=False)
        assert fired[0] == 0                         # merged adapter in eval mode: no dropout
        _generate(policy, MSGS[:1], [11], dropout=True)
        # every adapted module fires at the prefill and at each later decoding step
        assert fired[0] >= len(_lora_dropouts(model)) * 2
    finally:
        for h in handles:
            h.remove()
    assert not model.training and not any(m.training for m in _lora_dropouts(model))


def test_dropout_changes_the_sampling_law_reproducibly_and_leaves_torch_rng_alone(policy):
    seeds = [101, 202]
    plain = _generate(policy, MSGS[:2], seeds, dropout=False)
    state = torch.get_rng_state()
    first = _generate(policy, MSGS[:2], seeds, dropout=True)
    second = _generate(policy, MSGS[:2], seeds, dropout=True)
    assert torch.equal(torch.get_rng_state(), state)     # the run's generator is not touched
    assert torch.equal(first.input_ids, second.input_ids)   # masks come from the seeds alone
    assert not torch.equal(first.input_ids, plain.input_ids)  # p = 0.5 moves some token


def test_masks_come_from_the_prompts_seed_not_from_torchs_global_generator(policy):
    torch.manual_seed(0)
    a = _generate(policy, MSGS[:1], [31], dropout=True)
    torch.manual_seed(1)
    b = _generate(policy, MSGS[:1], [31], dropout=True)
    assert torch.equal(a.input_ids, b.input_ids)
    masks = {}
    model, _ = policy
    for seed in (31, 32):
        zeros: list[torch.Tensor] = []
        handles = [m.register_forward_hook(lambda _m, _a, out, zeros=zeros: zeros.append(out == 0))
                   for m in _lora_dropouts(model)]
        try:
            _generate(policy, MSGS[:1], [seed], dropout=True)
        finally:
            for h in handles:
                h.remove()
        masks[seed] = zeros[0]                      # the first adapted module at the prefill
    assert masks[31].float().mean() > 0.3            # p = 0.5 drops about half
    assert not torch.equal(masks[31], masks[32])


def test_a_prompts_masks_do_not_depend_on_its_batch_mates_when_isolated(policy):
    alone = _generate(policy, MSGS[:1], [7], dropout=True)
    with_mates = _generate(policy, MSGS, [7, 8, 9], dropout=True)
    assert alone.texts[0] == with_mates.texts[0]


def test_dropout_seed_is_a_stream_apart_from_the_sampling_coins():
    from dpgrpo.privacy.record_coins import torch_seed

    assert dropout_seed([5]) != torch_seed(5)            # not the coins' first 8 bytes
    assert dropout_seed([5]) == dropout_seed([5])
    assert dropout_seed([5, 6]) != dropout_seed([5]) != dropout_seed([6])
    assert dropout_seed([5], part=3) != dropout_seed([5])   # a group split over calls


def test_a_private_arm_refuses_a_dropout_stream_shared_by_batched_prompts():
    with pytest.raises(PrivacyError, match="rollout_isolation"):
        config_from_dict({"train": {"arm": "dp-grpo", "rollout_dropout": True}})
    ok = config_from_dict({"train": {"arm": "dp-grpo", "rollout_dropout": True,
                                        "rollout_isolation": "isolated"}})
    assert ok.train.engine_options()["sample_dropout"] is True
    assert config_from_dict({"train": {"arm": "non-private", "rollout_dropout": True}})
    with pytest.raises(ConfigError, match="rollout_engine"):
        config_from_dict({"train": {"arm": "non-private", "rollout_dropout": True,
                                       "rollout_engine": "vllm"}})


def _dropout_inputs(model, batch, *, train: bool) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    shapes: list[tuple[int, ...]] = []
    handles = [m.register_forward_hook(lambda _m, args, _o: shapes.append(tuple(args[0].shape)))
               for m in _lora_dropouts(model)]
    model.train(train)
    try:
        with torch.no_grad():
            logp, _, _ = window_logprobs(model, batch, slice(0, batch.rows_per_prompt))
    finally:
        model.eval()
        for h in handles:
            h.remove()
    return logp, shapes


@pytest.mark.parametrize("share", [True, False])
def test_share_prompt_pass_false_runs_every_row_whole(policy, share):
    model, tok = policy
    ro = synthetic_rollouts(tok, 2, G)
    rewards = torch.arange(2 * G, dtype=torch.float32).reshape(2, G)
    batch = build_grpo_batch(ro, rewards, share_prompt=share)
    shared = build_grpo_batch(ro, rewards)
    exact, _ = _dropout_inputs(model, shared, train=False)
    logp, shapes = _dropout_inputs(model, batch, train=False)
    torch.testing.assert_close(logp, exact, rtol=1e-5, atol=1e-5)   # the same values
    _, shapes = _dropout_inputs(model, batch, train=True)
    # shared: the prompt runs once (a 1-row call) before its G rows; whole: only G-row calls
    assert any(s[0] == 1 for s in shapes) is share
    assert all(s[0] == G for s in shapes) is not share
