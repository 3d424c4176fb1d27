"""GRPO advantages (Eq. 2), KL estimator (Eq. 3), token log-probs and the Eq. (7) row loss."""

from __future__ import annotations

import math

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.model import LoraSettings, attach_lora
from dpgrpo.objectives import TrainBatch
from dpgrpo.objectives.grpo import (
    ADVANTAGE_MODES,
    GRPOObjective,
    build_grpo_batch,
    compute_advantages,
    group_advantages,
    k3_kl,
    reference_logprobs,
    token_logprobs,
)
from dpgrpo.rollout import generate
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer


def test_group_advantages_by_hand():
    a = group_advantages(torch.tensor([[1., 0, 0, 0], [1., 1, 0, 0]], dtype=torch.float64))
    # row 0: mean 1/4, std (G-1) = sqrt((9/16 + 3/16) / 3) = 1/2
    expected0 = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64) / (0.5 + 1e-4)
    # row 1: mean 1/2, std = sqrt(4 * 1/4 / 3) = 1/sqrt(3)
    expected1 = torch.tensor([0.5, 0.5, -0.5, -0.5], dtype=torch.float64) / (
        1 / math.sqrt(3) + 1e-4)
    torch.testing.assert_close(a[0], expected0, rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], expected1, rtol=0, atol=1e-15)
    assert abs(float(a[0, 0]) - 1.4997000599880024) < 1e-12


def test_group_advantages_uses_g_minus_one_and_eps():
    r = torch.tensor([[0.3, 0.9, 0.1]], dtype=torch.float64)
    unbiased = (r - r.mean()) / (r.std(correction=1) + 1e-4)
    biased = (r - r.mean()) / (r.std(correction=0) + 1e-4)
    torch.testing.assert_close(group_advantages(r), unbiased, rtol=0, atol=1e-15)
    assert float((group_advantages(r) - biased).abs().max()) > 1e-2
    torch.testing.assert_close(group_advantages(r, eps=0.5), (r - r.mean()) / (r.std() + 0.5))


def test_constant_groups_single_rollout_and_row_isolation():
    r = torch.tensor([[1., 1, 1, 1], [0., 0, 0, 0], [1., 0, 1, 0]])
    a = group_advantages(r)
    assert torch.equal(a[:2], torch.zeros(2, 4))
    assert torch.equal(group_advantages(torch.tensor([[1.], [0.]])), torch.zeros(2, 1))
    r2 = r.clone()
    r2[0] = torch.tensor([0., 1, 1, 0])
    b = group_advantages(r2)
    assert torch.equal(a[1:], b[1:]) and not torch.equal(a[0], b[0])
    assert group_advantages(torch.zeros(0, 4)).shape == (0, 4)


def test_advantage_modes():
    r = torch.tensor([[1., 0, 0, 1, 1, 0, 0, 0], [0., 0, 0, 1, 0, 1, 1, 1]])
    assert set(ADVANTAGE_MODES) == {"group", "zero", "shuffled", "positive"}
    torch.testing.assert_close(compute_advantages(r, "group"), group_advantages(r))
    zero = compute_advantages(r, "zero")
    assert torch.equal(zero, torch.zeros_like(r))
    assert torch.equal(compute_advantages(r, "positive"), r)
    s1 = compute_advantages(r, "shuffled", generator=torch.Generator().manual_seed(1))
    s1b = compute_advantages(r, "shuffled", generator=torch.Generator().manual_seed(1))
    assert torch.equal(s1, s1b)
    group = group_advantages(r)
    assert torch.equal(s1.sort(dim=1).values, group.sort(dim=1).values)  # same multiset
    seeds = [compute_advantages(r, "shuffled", generator=torch.Generator().manual_seed(s))
             for s in range(5)]
    assert any(not torch.equal(s, group) for s in seeds)
    assert compute_advantages(r, "shuffled").shape == r.shape           # OS entropy
    with pytest.raises(ConfigError):
        compute_advantages(r, "batch-whitened")


def test_k3_kl_values():
    logp = torch.tensor([0.0, math.log(0.5), -2.0], dtype=torch.float64)
    ref = torch.tensor([0.0, 0.0, -1.0], dtype=torch.float64)
    k = k3_kl(logp, ref)
    assert float(k[0]) == 0.0
    d = math.log(2.0)
    assert abs(float(k[1]) - (math.exp(d) - d - 1)) < 1e-15
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


@pytest.fixture(scope="module")
def tiny():
    tok = build_tiny_tokenizer()
    model = attach_lora(build_tiny_model(tok, dtype="float64"), LoraSettings(dropout=0.0))
    rollouts = generate(model, tok, ["What is 12 plus 30?", "abc"], group_size=3,
                        temperature=1.0, max_new_tokens=6,
                        generator=torch.Generator().manual_seed(0))
    return tok, model.eval(), rollouts


def test_token_logprobs_match_full_softmax(tiny):
    _, model, ro = tiny
    pos = (ro.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask,
                       position_ids=pos).logits
        full = torch.log_softmax(logits[:, :-1], -1).gather(
            -1, ro.input_ids[:, 1:, None]).squeeze(-1)
        lp = token_logprobs(model, ro.input_ids, ro.attention_mask)
        first = int(ro.completion_mask.any(0).nonzero()[0])
        part = token_logprobs(model, ro.input_ids, ro.attention_mask, first=first)
    assert lp.shape == ro.input_ids.shape and torch.equal(lp[:, 0], torch.zeros(6).double())
    torch.testing.assert_close(lp[:, 1:], full, rtol=0, atol=1e-12)
    m = ro.completion_mask.bool()
    torch.testing.assert_close(part[m], lp[m], rtol=0, atol=1e-12)
    assert torch.equal(part[:, :first], torch.zeros(6, first).double())


def test_row_loss_with_fresh_adapter_is_minus_advantage(tiny):
    """LoRA B = 0: policy = reference, K = 0, ratio 1, so Eq. (7) gives row loss -A."""
    _, model, ro = tiny
    rewards = torch.tensor([[1., 0, 0], [0., 1, 1]], dtype=torch.float64)
    ref = reference_logprobs(model, ro)
    batch = build_grpo_batch(ro, rewards, ref_logprobs=ref)
    losses = GRPOObjective(beta=0.04).row_losses(model, batch, slice(0, 6))
    assert losses.dtype == torch.float64 and losses.shape == (6,)
    torch.testing.assert_close(losses, -batch.advantages.reshape(-1), rtol=0, atol=1e-12)
    per_prompt = (losses.view(2, 3) * batch.row_weights).sum(1)
    torch.testing.assert_close(per_prompt, torch.zeros(2, dtype=torch.float64), atol=1e-12,
                               rtol=0)


def test_row_loss_is_token_mean_over_own_tokens(tiny):
    _, model, ro = tiny
    adv = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = reference_logprobs(model, ro) - 0.3 * ro.completion_mask.double()   # nonzero KL
    batch = build_grpo_batch(ro, torch.zeros(2, 3), adv, ref)
    obj = GRPOObjective(beta=0.1)
    all_rows = obj.row_losses(model, batch, slice(0, 6))
    for r in range(6):
        torch.testing.assert_close(obj.row_losses(model, batch, slice(r, r + 1))[0],
                                   all_rows[r], rtol=1e-10, atol=1e-12)
    k = math.exp(-0.3) + 0.3 - 1                      # K per token when logp - ref = 0.3
    torch.testing.assert_close(all_rows, -(adv.reshape(-1) - 0.1 * k), rtol=0, atol=1e-13)


def test_build_grpo_batch_and_validation(tiny):
    _, model, ro = tiny
    batch = build_grpo_batch(ro, torch.tensor([[1., 0, 0], [0., 0, 0]]))
    assert isinstance(batch, TrainBatch)
    assert batch.num_prompts == 2 and batch.rows_per_prompt == 3 and batch.num_rows == 6
    assert torch.equal(batch.row_weights, torch.full((2, 3), 1 / 3))
    assert torch.equal(batch.loss_mask, ro.completion_mask)
    assert batch.prompt_rows(1) == slice(3, 6)
    with pytest.raises(ValueError):
        build_grpo_batch(ro, torch.zeros(3, 2))
    with pytest.raises(ValueError, match="ref_logprobs"):
        GRPOObjective().row_losses(model, batch, slice(0, 3))
    assert GRPOObjective(beta=0.0).row_losses(model, batch, slice(0, 3)).shape == (3,)
    with pytest.raises(ConfigError):
        GRPOObjective(beta=-1.0)
