"""The per-prompt-safe GRPO loss variants (train.loss_type, train.scale_rewards,
train.mask_truncated_completions): hand-computed losses, fast = reference, chunk identity,
and record isolation against batch-mates (a batch-level normaliser fails the same check)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from dpgrpo.config import RunConfig, apply_overrides
from dpgrpo.config.losses import LOSS_TYPES
from dpgrpo.errors import ConfigError
from dpgrpo.objectives import TrainBatch
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    compute_advantages,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.training.grads import flat_mean_gradient, per_prompt_grads, prompt_gradient
from dpgrpo.verify.fixtures import (
    build_tiny_tokenizer,
    random_specs,
    rollouts_from_specs,
    tiny_fp32_policy,
    tiny_fp64_policy,
)

VARIANTS = [GRPOObjective(beta=0.1, loss_type=t, max_completion_length=8) for t in LOSS_TYPES]
K = math.exp(-0.3) + 0.3 - 1          # k3 KL per token when logp - ref = 0.3


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def fresh(tok):
    """fp64 tiny Llama whose adapter is fresh (LoRA B = 0): the policy is the reference."""
    model, _ = tiny_fp64_policy(lora_scale=0.0)
    return model


@pytest.fixture(scope="module")
def policy64():
    return tiny_fp64_policy()[0]


@pytest.fixture(scope="module")
def policy32(tok):
    return tiny_fp32_policy(tok)


def _specs(lengths: list[list[int]], tok) -> list[tuple[str, list[list[int]]]]:
    """Completions of exactly these lengths (EOS last), tokens 5, 6, ... (never EOS or pad)."""
    messages = ["What is 12 plus 30?", "abc", "Tom has 3 apples."]
    return [(messages[i], [[5 + j for j in range(n - 1)] + [tok.eos_token_id] for n in row])
            for i, row in enumerate(lengths)]


def _batch(model, tok, specs, rewards, *, scale=True, shift=0.0, mask_truncated=False):
    rollouts = rollouts_from_specs(tok, specs)
    ref = reference_logprobs(model, rollouts, batch_size=2)
    ref = ref - shift * rollouts.completion_mask.to(ref.dtype)
    adv = group_advantages(rewards.to(ref.dtype), scale=scale)
    return build_grpo_batch(rollouts, rewards, adv, ref, mask_truncated=mask_truncated)


def test_dr_grpo_advantages_are_centred_only():
    r = torch.tensor([[1., 0, 0], [1., 1, 0], [1., 1, 1]], dtype=torch.float64)
    a = group_advantages(r, scale=False)
    torch.testing.assert_close(a, torch.tensor([[2 / 3, -1 / 3, -1 / 3], [1 / 3, 1 / 3, -2 / 3],
                                                [0., 0, 0]], dtype=torch.float64),
                               rtol=0, atol=1e-15)
    for mode in ("group", "shuffled"):
        gen = torch.Generator().manual_seed(3)
        s = compute_advantages(r, mode, generator=gen, scale=False)
        assert torch.equal(s.sort(dim=1).values, a.sort(dim=1).values)  # same multiset
    r2 = r.clone()
    r2[0] = torch.tensor([0., 5, 1])                                     # one prompt changes
    assert torch.equal(group_advantages(r2, scale=False)[1:], a[1:])     # the others do not


def test_losses_match_a_hand_computation(fresh, tok):
    """Prompt 0: lengths 2, 4, 6, rewards 1, 0, 0; A = r - mean (scale 'none'); every token's
    term is A - beta K. Eq. (7) gives beta K; Dr. GRPO (cap 8) (1/G) sum_r -(A_r - beta K)
    L_r / 8 = 1/12 + beta K / 2; the per-prompt token mean -sum_r (A_r - beta K) L_r / 12 =
    1/6 + beta K."""
    specs = _specs([[2, 4, 6], [3, 3, 1]], tok)
    rewards = torch.tensor([[1., 0, 0], [1., 1, 0]])
    batch = _batch(fresh, tok, specs, rewards, scale=False, shift=0.3)
    assert batch.loss_mask.sum(1).tolist() == [2, 4, 6, 3, 3, 1]
    beta_k = 0.1 * K
    expected = {"grpo": [beta_k, beta_k],
                "dr_grpo": [1 / 12 + beta_k / 2, -(1 / 3 * 3 + 1 / 3 * 3 - 2 / 3 * 1) / 24
                            + beta_k * 7 / 24],
                "prompt_token_mean": [1 / 6 + beta_k, -(1 + 1 - 2 / 3) / 7 + beta_k]}
    for obj in VARIANTS:
        rows = obj.row_losses(fresh, batch, slice(0, 6)).view(2, 3)
        per_prompt = (rows * batch.row_weights).sum(1)
        torch.testing.assert_close(per_prompt, torch.tensor(expected[obj.loss_type],
                                                            dtype=torch.float64),
                                   rtol=0, atol=1e-12, msg=obj.loss_type)
        for i in range(2):  # the same value whichever rows a pass holds
            loss, _ = prompt_gradient(fresh, obj, batch, i, rows_per_pass=1)
            torch.testing.assert_close(loss, per_prompt[i], rtol=0, atol=1e-12)


def test_mask_truncated_completions_leaves_capped_rows_out(fresh, tok):
    """Row 2 of prompt 0 hits the cap (no EOS): no loss tokens, so it is out of every loss,
    normaliser included; its reward still enters its group's mean."""
    specs = _specs([[2, 4, 6]], tok)
    specs[0][1][2][-1] = 9                                               # no EOS: capped
    rewards = torch.tensor([[1., 0, 0]])
    batch = _batch(fresh, tok, specs, rewards, scale=False, shift=0.3, mask_truncated=True)
    assert batch.loss_mask.sum(1).tolist() == [2, 4, 0]
    assert batch.advantages[0].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    beta_k = 0.1 * K
    for obj, want in zip(VARIANTS, (-(2 / 3 - 1 / 3 - 2 * beta_k) / 3,
                                    -((2 / 3 - beta_k) * 2 + (-1 / 3 - beta_k) * 4) / 24,
                                    -((2 / 3 - beta_k) * 2 + (-1 / 3 - beta_k) * 4) / 6)):
        rows = obj.row_losses(fresh, batch, slice(0, 3))
        assert float(rows[2]) == 0.0
        assert float((rows * batch.row_weights[0]).sum()) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("obj", VARIANTS, ids=lambda o: o.loss_type)
def test_fast_equals_reference_and_pass_sizes_only_reorder(policy64, tok, obj):
    specs = random_specs(tok, 4, 3, group=4)
    rewards = torch.tensor([[1., 0, 0, 1], [0., 0, 1, 0], [1., 1, 1, 0]], dtype=torch.float64)
    batch = _batch(policy64, tok, specs, rewards, shift=0.0)
    whole = per_prompt_grads(policy64, obj, batch, method="reference")
    for method in ("fast", "reference"):
        for rows in (1, 3, 4):
            part = per_prompt_grads(policy64, obj, batch, method=method, rows_per_pass=rows)
            for name in whole:
                scale = float(whole[name].abs().max())
                assert scale > 0
                assert float((part[name] - whole[name]).abs().max()) <= 1e-10 * scale, \
                    (method, rows, name)
    flat = flat_mean_gradient(policy64, obj, batch)  # rows of all prompts in one call
    for name in flat:
        torch.testing.assert_close(whole[name].sum(0) / 3, flat[name], rtol=1e-9, atol=1e-12)


@dataclass(frozen=True)
class _BatchTokenMean(GRPOObjective):
    """A negative control: DAPO's batch-level normaliser (refused by dpgrpo's config)."""

    def row_losses(self, model, batch: TrainBatch, rows: slice) -> torch.Tensor:
        base = GRPOObjective(beta=self.beta, loss_type="dr_grpo", max_completion_length=1)
        total = float(batch.loss_mask.sum())                             # every prompt's tokens
        return base.row_losses(model, batch, rows) * batch.rows_per_prompt / total


@pytest.mark.parametrize("method", ["fast", "reference"])
@pytest.mark.parametrize("obj", [*VARIANTS, GRPOObjective(beta=0.1, temperature=0.7),
                                 GRPOObjective(beta=0.1, kl_bias_correction=True)],
                         ids=lambda o: f"{o.loss_type}-T{o.temperature:g}"
                                       f"{'-corrected' if o.kl_bias_correction else ''}")
def test_batchmates_leave_other_prompts_bit_identical(policy32, tok, obj, method):
    """As tests/training/test_grads.py's check, for each variant with mask_truncated and no std: a
    much longer batch-mate changes no other prompt's gradient by one bit (fp32)."""
    specs, longer = random_specs(tok, 0, 3), random_specs(tok, 1, 1, long=True)
    rewards = torch.tensor([[1., 0, 1], [0, 0, 1], [1, 1, 0]])
    kw = {"scale": False, "mask_truncated": True}
    alone = _batch(policy32, tok, specs, rewards, **kw)
    crowded = _batch(policy32, tok, [specs[0], longer[0], specs[1], specs[2]],
                     torch.cat([rewards[:1], torch.tensor([[0., 1, 1]]), rewards[1:]]), **kw)
    assert crowded.loss_mask.sum() > alone.loss_mask.sum() + 20          # many more tokens
    a = per_prompt_grads(policy32, obj, alone, method=method, rows_per_pass=2)
    b = per_prompt_grads(policy32, obj, crowded, method=method, rows_per_pass=2)
    for i, j in ((0, 0), (1, 2), (2, 3)):
        for name in a:
            assert torch.equal(a[name][i], b[name][j]), (i, name)
    assert float(sum(a[n][0].abs().sum() for n in a)) > 0
    control = _BatchTokenMean(beta=0.04)                                 # the check has power
    ca = per_prompt_grads(policy32, control, alone, method=method, rows_per_pass=2)
    cb = per_prompt_grads(policy32, control, crowded, method=method, rows_per_pass=2)
    assert any(not torch.equal(ca[n][0], cb[n][0]) for n in ca)


def test_config_maps_the_variants_and_refuses_batch_statistics():
    cfg = apply_overrides(RunConfig(), ["train.loss_type=dr_grpo", "train.scale_rewards=none",
                                        "train.mask_truncated_completions=true",
                                        "train.top_p=0.9", "train.repetition_penalty=1.1"])
    t = cfg.train
    assert (t.loss_type, t.scale_rewards, t.mask_truncated_completions, t.top_p,
            t.repetition_penalty) == ("dr_grpo", "none", True, 0.9, 1.1)
    for value in ("dapo", "bnpo"):
        with pytest.raises(ConfigError, match=r"cannot hold under prompt-level DP.*"
                                              r"'prompt_token_mean'"):
            apply_overrides(RunConfig(), [f"train.loss_type={value}"])
    with pytest.raises(ConfigError, match="batch-level standard deviation"):
        apply_overrides(RunConfig(), ["train.scale_rewards=batch"])
    with pytest.raises(ConfigError, match="one of grpo, dr_grpo, prompt_token_mean"):
        apply_overrides(RunConfig(), ["train.loss_type=cispo"])
    with pytest.raises(ConfigError, match="top_p"):
        apply_overrides(RunConfig(), ["train.top_p=0"])
    with pytest.raises(ConfigError, match="completion cap"):
        GRPOObjective(loss_type="dr_grpo")


def test_the_arm_uses_the_options(tok):
    from types import SimpleNamespace

    from dpgrpo.config import embedded_default
    from dpgrpo.training.arms import make_arm
    from dpgrpo.verify.fixtures import synthetic_rollouts

    seen = {}

    class Engine:
        def generate(self, messages, *, group_size, **kw):
            seen.update(kw)
            batch = synthetic_rollouts(tok, len(messages), group_size)
            batch.texts = [[f"{i} {r}" for r in range(group_size)] for i in range(len(messages))]
            return batch

    class Task:
        default_max_new_tokens = 7

        def prompt(self, problem):
            return f"question {problem}"

        def reward(self, text, problem):
            return float(text.split()[1] == "0")

    cfg = apply_overrides(embedded_default(), [
        "train.group_size=3", "train.beta=0", "train.max_new_tokens=none",
        "train.loss_type=prompt_token_mean", "train.scale_rewards=none",
        "train.mask_truncated_completions=true", "train.top_p=0.8",
        "train.repetition_penalty=1.2", "train.kl_bias_correction=true"])
    arm = make_arm(cfg, SimpleNamespace(model=object(), tokenizer=tok), Task())
    assert (arm.objective.loss_type, arm.objective.max_completion_length) == (
        "prompt_token_mean", 7)
    assert arm.objective.kl_bias_correction
    assert not make_arm(embedded_default(), SimpleNamespace(model=object(), tokenizer=tok),
                        Task()).objective.kl_bias_correction
    arm._engine = Engine()
    batch, _ = arm.batch([(Task(), 0), (Task(), 1)], torch.Generator().manual_seed(0))
    assert (seen["top_p"], seen["repetition_penalty"]) == (0.8, 1.2)
    assert batch.advantages.tolist() == [[pytest.approx(2 / 3), pytest.approx(-1 / 3),
                                          pytest.approx(-1 / 3)]] * 2
    capped = synthetic_rollouts(tok, 2, 3).hit_cap
    assert capped.any() and (batch.loss_mask.sum(1)[capped] == 0).all()
    assert (batch.loss_mask.sum(1)[~capped] > 0).all()


def test_tempered_logprobs_reach_the_objective_and_the_reference(fresh, tok):
    """train.tempered_logprobs: Eq. (7) and Eq. (3) on softmax(logits / train.temperature), the
    policy's and the reference's log-probs alike (a fresh adapter then has zero KL, which a
    reference left at temperature 1 would not)."""
    from types import SimpleNamespace

    from dpgrpo.config import embedded_default
    from dpgrpo.objectives.logprobs import token_logprobs
    from dpgrpo.training.arms import make_arm

    specs = _specs([[2, 4, 6], [3, 3, 1]], tok)

    class Engine:
        def generate(self, messages, *, group_size, **kw):
            batch = rollouts_from_specs(tok, specs)
            batch.texts = [["1", "0", "0"], ["1", "1", "0"]]
            return batch

    class Task:
        default_max_new_tokens = 8

        def prompt(self, problem):
            return specs[problem][0]

        def reward(self, text, problem):
            return float(text)

    base = ["train.group_size=3", "train.beta=0.1", "train.max_new_tokens=none",
            "train.temperature=0.5"]
    for tempered, want in ((True, 0.5), (False, 1.0)):
        cfg = apply_overrides(embedded_default(), [*base, f"train.tempered_logprobs={tempered}"])
        assert cfg.train.logprob_temperature == want
        arm = make_arm(cfg, SimpleNamespace(model=fresh, tokenizer=tok), Task())
        assert arm.objective.temperature == want
        arm._engine = Engine()
        batch, _ = arm.batch([(Task(), 0), (Task(), 1)], torch.Generator().manual_seed(0))
        rollouts = rollouts_from_specs(tok, specs)
        ids, attn, mask = rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask
        with torch.no_grad():
            at_t = token_logprobs(fresh, ids, attn, mask=mask, temperature=want)
            at_1 = token_logprobs(fresh, ids, attn, mask=mask)
        torch.testing.assert_close(batch.ref_logprobs, at_t, rtol=0, atol=1e-12)
        assert (float((batch.ref_logprobs - at_1).abs().max()) > 1e-3) == tempered
        zero = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                          batch.row_weights, 2, 3, torch.zeros_like(batch.advantages),
                          batch.ref_logprobs)
        kl = arm.objective.row_losses(fresh, zero, slice(0, 6))          # beta K only
        assert float(kl.abs().max()) < 1e-12
        if tempered:                                                     # mismatched T: K > 0
            other = GRPOObjective(beta=0.1, temperature=1.0)
            assert float(other.row_losses(fresh, zero, slice(0, 6)).min()) > 1e-6


@pytest.mark.parametrize("corrected", [False, True])
def test_kl_bias_correction_gives_the_sequence_kl_gradient(policy64, tok, corrected):
    """train.kl_bias_correction (TRL's use_bias_correction_kl): the same loss value, but each
    token's KL gradient is beta (u - u_ref) grad u, not Eq. (3)'s beta (1 - pi_ref/pi) grad u.
    Checked against a surrogate sum_k c_k u_k / L with the per-token coefficients c_k written
    out by hand, on an adapter far enough from the reference that the two rules differ."""
    from dpgrpo.objectives.logprobs import token_logprobs

    specs = random_specs(tok, 5, 3, group=3)
    rewards = torch.tensor([[1., 0, 0], [0., 1, 1], [1., 1, 1]], dtype=torch.float64)
    batch = _batch(policy64, tok, specs, rewards)
    ref, mask = batch.ref_logprobs, batch.loss_mask.to(torch.float64)
    params = [p for p in policy64.parameters() if p.requires_grad]
    obj = GRPOObjective(beta=0.5, kl_bias_correction=corrected)
    loss = (obj.row_losses(policy64, batch, slice(0, 9)) * batch.row_weights.reshape(-1)).sum()
    plain = GRPOObjective(beta=0.5).row_losses(policy64, batch, slice(0, 9))
    torch.testing.assert_close(obj.row_losses(policy64, batch, slice(0, 9)), plain,
                               rtol=0, atol=1e-14)                         # the value is K's
    got = torch.autograd.grad(loss, params)

    u = token_logprobs(policy64, batch.input_ids, batch.attention_mask, mask=batch.loss_mask)
    d = (u - ref).detach() * mask                                        # u - u_ref per token
    assert float(d.abs().max()) > 0.05                                   # the rules differ here
    kl_grad = d if corrected else (1 - torch.exp(-d)) * mask             # per-token coefficient
    c = -batch.advantages.reshape(-1, 1) + 0.5 * kl_grad
    surrogate = ((c * u * mask).sum(1) / mask.sum(1) * batch.row_weights.reshape(-1)).sum()
    want = torch.autograd.grad(surrogate, params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    other = torch.autograd.grad(
        (GRPOObjective(beta=0.5, kl_bias_correction=not corrected).row_losses(
            policy64, batch, slice(0, 9)) * batch.row_weights.reshape(-1)).sum(), params)
    gap = sum(float((a - b).norm()) for a, b in zip(got, other))
    assert gap > 1e-3 * sum(float(a.norm()) for a in got)                # the option matters
