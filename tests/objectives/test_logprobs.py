"""Chunked fused log-probs equal the unfused (N, L, V) computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.objectives.logprobs import chosen_logprobs, token_logprobs, token_logprobs_and_entropy

VOCAB = 151_936   # Qwen2.5's vocabulary


@pytest.fixture(scope="module")
def big_vocab_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.requires_grad_(False).eval()


def _inputs():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 24), generator=gen)
    attn = torch.ones_like(ids)
    attn[0, :5] = 0                                        # left padding
    mask = torch.zeros_like(ids)
    mask[:, 12:] = 1
    mask[1, 20:] = 0                                       # a shorter completion
    return ids, attn, mask


def _unfused(model, ids, attn, mask, shift):
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
    logits = model.lm_head(hidden + shift)[:, :-1].float()                   # (N, L-1, V)
    logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    return torch.nn.functional.pad(logp, (1, 0)) * mask


@pytest.mark.parametrize("chunk", [None, 7])
def test_equals_unfused_values_and_gradients(big_vocab_model, chunk):
    """fp32, 151,936-token vocabulary: values and gradients agree to 1e-5."""
    model = big_vocab_model
    ids, attn, mask = _inputs()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    shift = torch.zeros(32, requires_grad=True)     # a trainable input to the head
    ref = _unfused(model, ids, attn, mask, shift)
    (ref * weights).sum().backward()
    grad_ref, shift.grad = shift.grad.clone(), None

    handle = model.model.norm.register_forward_hook(lambda m, a, out: out + shift)
    try:
        fused = token_logprobs(model, ids, attn, mask=mask, chunk=chunk)
        (fused * weights).sum().backward()
    finally:
        handle.remove()
    assert fused.shape == ids.shape and fused.dtype == torch.float32
    assert torch.equal(fused == 0, mask == 0)       # scored exactly where asked
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shift.grad, grad_ref, rtol=1e-5, atol=1e-5)


def test_entropy_matches_full_softmax(big_vocab_model):
    model = big_vocab_model
    ids, attn, mask = _inputs()
    logp, ent = token_logprobs_and_entropy(model, ids, attn, mask, chunk=5)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn,
                       position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, :-1].float()
        full = torch.log_softmax(logits, -1)
        want = mask[:, 1:].bool()
        h_ref = -(full.exp() * full).sum(-1)[want]
        lp_ref = full.gather(-1, ids[:, 1:, None]).squeeze(-1)[want]
    torch.testing.assert_close(ent[:, 1:][want], h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp[:, 1:][want], lp_ref, rtol=1e-5, atol=1e-5)
    assert float(ent[:, 1:][~want].abs().max()) == 0.0


def test_softcap_and_bias_gradients_fp64():
    """Soft-capped logits with a bias: gradient equals autograd through the full softmax."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    bias = torch.randn(50, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 50, (9,), generator=gen)
    up = torch.randn(9, generator=gen, dtype=torch.float64)
    z = 3.0 * torch.tanh((hidden @ weight.T + bias) / 3.0)
    ref = torch.log_softmax(z, -1).gather(-1, targets[:, None]).squeeze(-1)
    (grad_ref,) = torch.autograd.grad((ref * up).sum(), hidden)
    out = chosen_logprobs(hidden, weight, targets, bias=bias, softcap=3.0, chunk=4)
    (grad,) = torch.autograd.grad((out * up).sum(), hidden)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_tempered_values_and_gradients_fp64(softcap):
    """temperature T: log softmax(z / T), z after the cap, values and gradients to 1e-12; the
    same tokens at T 1 differ (the check has power)."""
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 50, (9,), generator=gen)
    up = torch.randn(9, generator=gen, dtype=torch.float64)
    z = hidden @ weight.T
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    ref = torch.log_softmax(z / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    (grad_ref,) = torch.autograd.grad((ref * up).sum(), hidden)
    out = chosen_logprobs(hidden, weight, targets, softcap=softcap, chunk=4, temperature=0.7)
    (grad,) = torch.autograd.grad((out * up).sum(), hidden)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-12)
    plain = chosen_logprobs(hidden, weight, targets, softcap=softcap, chunk=4)
    assert float((plain - out).abs().max()) > 1e-3
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        chosen_logprobs(hidden, weight, targets, temperature=0.0)


def test_trainable_head_is_refused():
    weight = torch.zeros(5, 3, requires_grad=True)
    with pytest.raises(ConfigError, match="frozen lm_head"):
        chosen_logprobs(torch.zeros(2, 3), weight, torch.tensor([0, 1]))


@pytest.mark.cuda
@pytest.mark.parametrize("chunk", [None, 7])
def test_bf16_head_on_cuda_equals_the_unfused_computation(chunk):
    """bf16 hidden states and head on CUDA (the MATH preset's dtype): logits are formed in bf16
    and upcast to fp32 as ``model(...).logits.float()`` would be, so values agree with the
    unfused (K, V) computation to bf16 rounding of the logits, and the gradient with respect
    to the hidden states agrees with autograd through it."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(40, 64, generator=gen).to("cuda", torch.bfloat16)
    weight = (0.05 * torch.randn(VOCAB, 64, generator=gen)).to("cuda", torch.bfloat16)
    targets = torch.randint(0, VOCAB, (40,), generator=gen).to("cuda")
    grad_out = torch.randn(40, generator=gen).to("cuda")

    h_ref = hidden.clone().requires_grad_(True)
    logits = torch.nn.functional.linear(h_ref, weight).float()                 # (K, V)
    ref = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    (ref * grad_out).sum().backward()

    h = hidden.clone().requires_grad_(True)
    fused = chosen_logprobs(h, weight, targets, chunk=chunk)
    (fused * grad_out).sum().backward()
    assert fused.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    torch.testing.assert_close(fused, ref, rtol=0, atol=2e-2)
    err = (h.grad.float() - h_ref.grad.float()).norm() / h_ref.grad.float().norm()
    assert float(err) < 2e-2, float(err)


# --- two different prompts of equal length (issue 32) -----------------------------------------

def _equal_length_prompts(tok, count: int = 2) -> list[str]:
    """Messages whose chat prompts tokenize to the same length with different tokens."""
    by_length: dict[int, list[str]] = {}
    for a in range(10, 99):
        message = f"What is {a} plus {a + 7}?"
        text = tok.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                       add_generation_prompt=True)
        length = len(tok(text, add_special_tokens=False)["input_ids"])
        by_length.setdefault(length, []).append(message)
    return max(by_length.values(), key=len)[:count]


def test_equal_length_prompts_never_share_a_prompt_pass():
    """A prompt's key/value cache must never serve another prompt of the same length: the
    reference pass (one prompt per forward, its cache extended by its G rows) and a window of
    two groups give each prompt exactly the values it gets alone, and the two prompts' values
    differ on identical completions (so the comparison can see a swapped cache)."""
    import torch

    from dpgrpo.objectives.grpo import reference_logprobs
    from dpgrpo.objectives.logprobs import token_logprobs
    from dpgrpo.verify.fixtures import build_tiny_tokenizer, rollouts_from_specs, tiny_fp32_policy

    tok = build_tiny_tokenizer()
    model = tiny_fp32_policy(tok)
    first, second = _equal_length_prompts(tok)
    assert first != second
    gen = torch.Generator().manual_seed(5)
    comps = [[*torch.randint(3, len(tok), (6,), generator=gen).tolist(), tok.eos_token_id]
             for _ in range(3)]  # the same completions under both prompts
    both = rollouts_from_specs(tok, [(first, comps), (second, comps)])
    alone = [rollouts_from_specs(tok, [(m, comps)]) for m in (first, second)]
    assert both.input_ids.shape[1] == alone[0].input_ids.shape[1] == alone[1].input_ids.shape[1]
    mask = both.completion_mask.bool()
    for together in (reference_logprobs(model, both, batch_size=3),
                     reference_logprobs(model, both)):
        for i, single in enumerate(reference_logprobs(model, a) for a in alone):
            rows = slice(3 * i, 3 * i + 3)
            assert torch.equal(together[rows], single), f"prompt {i} took another's cache"
        assert not torch.equal(together[0:3][mask[0:3]], together[3:6][mask[3:6]])
    with torch.no_grad():  # one forward over both groups: each group's own prompt
        shared = token_logprobs(model, both.input_ids, both.attention_mask,
                                mask=both.completion_mask, group_size=3)
        plain = token_logprobs(model, both.input_ids, both.attention_mask,
                               mask=both.completion_mask)
    assert torch.allclose(shared, plain, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(shared[0:3][mask[0:3]], shared[3:6][mask[3:6]], atol=1e-3)
