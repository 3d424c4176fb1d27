"""The frozen trunk computed once (dpgrpo.objectives.trunk): the gradient pass replays what the
reference pass computed below the lowest adapted layer, skips those layers, gets the same
gradients, and never replays a state computed from another window (record isolation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpgrpo.model import LoraSettings, attach_lora
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.objectives.trunk import Trunk
from dpgrpo.rollout import generate
from dpgrpo.training.grads import per_prompt_grads
from dpgrpo.training.lora_hooks import adapted_layer_index
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer, exact_rmsnorm

QUESTIONS = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more.", "Answer: A B C",
             "Solve the problem step by step."]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def upper(tok):
    """fp64 tiny Llama of 4 layers, LoRA (random B) on the top two only: layers 0-1 frozen."""
    base = build_tiny_model(tok, layers=4, dtype="float64")
    exact_rmsnorm(base)
    model = attach_lora(base, LoraSettings(dropout=0.0, layers=(-2, -1)))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    return model.eval()


def _rollouts(model, tok, questions, seed=0, group=3):
    return generate(model, tok, [[{"role": "user", "content": q}] for q in questions],
                    group_size=group, temperature=1.0, max_new_tokens=6, isolated=True,
                    generator=torch.Generator().manual_seed(seed))


def _batch(model, rollouts, trunk=None):
    rewards = torch.arange(rollouts.num_prompts * rollouts.group_size, dtype=torch.float64)
    rewards = (rewards.reshape(rollouts.num_prompts, -1) % 2)
    ref = reference_logprobs(model, rollouts, trunk=trunk)
    return build_grpo_batch(rollouts, rewards, group_advantages(rewards), ref, trunk=trunk)


def _lower_calls(model):
    """Counts what decoder layers 0 and 1 (the frozen trunk) compute: calls of their MLPs."""
    calls = [0]

    def count(*_):
        calls[0] += 1

    layers = model.get_base_model().model.layers
    handles = [layers[i].mlp.register_forward_pre_hook(count) for i in (0, 1)]
    return calls, handles


def _max_abs(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_the_lowest_adapted_layer_is_found(upper, tok):
    assert adapted_layer_index(upper) == 2
    whole = attach_lora(build_tiny_model(tok, layers=2), LoraSettings(dropout=0.0))
    assert adapted_layer_index(whole) == 0           # an adapter on layer 0: nothing to share
    with pytest.raises(ValueError, match="frozen layer"):
        Trunk(0)


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_replayed_trunk_gives_the_gradients_of_the_full_pass(upper, tok, method):
    rollouts = _rollouts(upper, tok, QUESTIONS[:3])
    plain = _batch(upper, rollouts)
    trunk = Trunk(2)
    shared = _batch(upper, rollouts, trunk)
    assert len(trunk) == 3                            # one window per prompt recorded
    assert torch.equal(shared.ref_logprobs, plain.ref_logprobs)   # recording changes nothing
    calls, handles = _lower_calls(upper)
    try:
        full = per_prompt_grads(upper, GRPOObjective(beta=0.04), plain, method=method)
        full_calls = calls[0]
        fast = per_prompt_grads(upper, GRPOObjective(beta=0.04), shared, method=method)
    finally:
        for h in handles:
            h.remove()
    assert full_calls > 0 and calls[0] == full_calls   # the replay ran no frozen layer
    assert _max_abs(full, fast) < 1e-12               # fp64: the same up to rounding
    assert max(float(g.abs().max()) for g in full.values()) > 1e-3   # a real gradient


def _graded(rollouts, trunk=None, ref=None):
    rewards = torch.tensor([[1., 0, 0], [0, 1, 1]], dtype=torch.float64)
    return build_grpo_batch(rollouts, rewards, group_advantages(rewards), ref, trunk=trunk)


def test_a_window_never_replays_another_windows_states(upper, tok):
    """States recorded for other prompts are not used: the layers run, and the gradients are
    the full pass's bits. (Mutation: a key without the tokens replays them and fails here.)"""
    mine = _rollouts(upper, tok, QUESTIONS[:2], seed=1)
    shifted = torch.where(mine.completion_mask.bool(), 3 + (mine.input_ids - 2) % (len(tok) - 3),
                          mine.input_ids)                 # other completions, same layout
    other = dataclasses.replace(mine, input_ids=shifted)
    assert not torch.equal(other.input_ids, mine.input_ids)
    trunk = Trunk(2)
    reference_logprobs(upper, other, trunk=trunk)      # states of other prompts only
    assert len(trunk) == 2
    ref = reference_logprobs(upper, mine)
    calls, handles = _lower_calls(upper)
    try:
        got = per_prompt_grads(upper, GRPOObjective(beta=0.04), _graded(mine, trunk, ref),
                               method="reference")
    finally:
        for h in handles:
            h.remove()
    assert calls[0] > 0                               # nothing replayed
    want = per_prompt_grads(upper, GRPOObjective(beta=0.04), _graded(mine, None, ref),
                            method="reference")
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_prompts_gradient_does_not_depend_on_its_batch_mates(upper, tok):
    """Prompt 0's replayed gradient is the same bits beside either batch-mate (A2)."""
    a = _rollouts(upper, tok, [QUESTIONS[0], QUESTIONS[1]], seed=4)
    b = _rollouts(upper, tok, [QUESTIONS[0], QUESTIONS[3]], seed=4)
    ga = per_prompt_grads(upper, GRPOObjective(beta=0.04),
                          _graded(a, Trunk(2), reference_logprobs(upper, a)))
    ta, tb = Trunk(2), Trunk(2)
    ga = per_prompt_grads(upper, GRPOObjective(beta=0.04),
                          _graded(a, ta, reference_logprobs(upper, a, trunk=ta)))
    gb = per_prompt_grads(upper, GRPOObjective(beta=0.04),
                          _graded(b, tb, reference_logprobs(upper, b, trunk=tb)))
    for k in ga:
        assert torch.equal(ga[k][0], gb[k][0])
        assert not torch.equal(ga[k][1], gb[k][1])


@pytest.mark.parametrize("share", [True, False])
def test_the_arm_records_the_trunk_for_its_gradient_pass(upper, tok, share):
    """A DP-GRPO round's batch carries the reference pass's trunk (train.share_frozen_layers,
    default on); switched off, it carries none."""
    from types import SimpleNamespace

    from dpgrpo.config import apply_overrides, embedded_default
    from dpgrpo.training.arms import make_arm

    rollouts = _rollouts(upper, tok, QUESTIONS[:2])

    class Engine:
        def generate(self, messages, **kwargs):
            return rollouts

    class Task:
        default_max_new_tokens = 6

        def prompt(self, problem):
            return [{"role": "user", "content": QUESTIONS[problem]}]

        def reward(self, text, problem):
            return float(len(text) % 2)

    cfg = apply_overrides(embedded_default(), ["train.group_size=3", "train.beta=0.04",
                                               f"train.share_frozen_layers={str(share).lower()}"])
    arm = make_arm(cfg, SimpleNamespace(model=upper, tokenizer=tok), Task())
    arm._engine = Engine()
    batch, _ = arm.batch([(Task(), 0), (Task(), 1)], torch.Generator().manual_seed(0))
    if share:
        assert isinstance(batch.trunk, Trunk) and len(batch.trunk) == 2
        assert batch.trunk.layer == 2
    else:
        assert batch.trunk is None


def test_gold_sft_keeps_each_records_trunk_across_rounds(upper, tok):
    """Gold SFT's windows are the same every round: the arm's kept trunk records a record's
    frozen layers the first time it is sampled, and later rounds replay them with the same
    gradient bits; the memory cap is honoured (0 keeps nothing)."""
    from types import SimpleNamespace

    from dpgrpo.config import apply_overrides, embedded_default
    from dpgrpo.objectives.sft import SFTObjective
    from dpgrpo.training.arms import make_arm

    class Task:
        default_max_new_tokens = 6

        def prompt(self, problem):
            return [{"role": "user", "content": QUESTIONS[problem]}]

        def gold_target(self, problem):
            return f"The answer is {problem * 7}."

    def arm(mb):
        cfg = apply_overrides(embedded_default(), ["train.arm=non-private-gold-sft",
                                                   f"train.frozen_layer_cache_mb={mb}"])
        return make_arm(cfg, SimpleNamespace(model=upper, tokenizer=tok), Task())

    kept, plain = arm(512), arm(0)
    first, _ = kept.batch([(Task(), 0), (Task(), 1)])
    fresh = per_prompt_grads(upper, SFTObjective(), first, method="reference")
    assert len(first.trunk) == 2 and first.trunk.bytes > 0
    again, _ = kept.batch([(Task(), 1), (Task(), 2)])               # record 1 again, and 2
    assert again.trunk is first.trunk
    calls, handles = _lower_calls(upper)
    try:
        replayed = per_prompt_grads(upper, SFTObjective(), again, method="reference")
    finally:
        for h in handles:
            h.remove()
    assert calls[0] == 2                               # layers 0-1 ran for record 2 only
    assert len(again.trunk) == 3
    for k in fresh:
        assert torch.equal(replayed[k][0], fresh[k][1])             # record 1: the same bits
    none, _ = plain.batch([(Task(), 0)])
    assert none.trunk is None
    with pytest.raises(Exception, match="frozen_layer_cache_mb"):
        apply_overrides(embedded_default(), ["train.frozen_layer_cache_mb=-1"])
