"""Per-prompt gradients: fast path = reference loop, chunk identity, cross-prompt isolation,
non-private equivalence and zero-advantage groups (paper, Appendix B), in float64."""

from __future__ import annotations

import pytest
import torch

from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.model import LoraSettings, attach_lora
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.rollout import RolloutBatch, generate
from dpgrpo.training.grads import (
    flat_mean_gradient,
    per_prompt_grads,
    per_prompt_grads_fast,
    per_prompt_grads_reference,
    prompt_gradient,
    trainable_parameters,
)
from dpgrpo.verify.fixtures import (
    build_tiny_model,
    build_tiny_tokenizer,
    exact_rmsnorm,
    random_specs,
    rollouts_from_specs,
    tiny_fp32_policy,
)

MESSAGES = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more.", "Answer: A B C",
            "abc", "Solve the problem step by step."]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def policy(tok):
    """fp64 tiny Llama with a nonzero LoRA adapter (so the KL term has a gradient)."""
    base = build_tiny_model(tok, dtype="float64")
    exact_rmsnorm(base)
    return _random_lora_b(attach_lora(base, LoraSettings(dropout=0.0)), seed=7)


def _random_lora_b(model, *, seed: int):
    """``model`` with lora_B drawn N(0, 0.2^2) (a fresh B is zero: no KL gradient), in eval."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    return model.eval()


def make_rollouts(tok, num_prompts: int, group: int, *, seed: int = 0,
                  same_prompt: bool = False) -> RolloutBatch:
    """Left-padded prompts of unequal length, completions of unequal length (some hit cap)."""
    gen = torch.Generator().manual_seed(seed)
    msgs = [MESSAGES[0 if same_prompt else i % len(MESSAGES)] for i in range(num_prompts)]
    texts = [tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                     add_generation_prompt=True) for m in msgs]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
    cap, n = 7, num_prompts * group
    lengths = torch.tensor([1 + (r * 3) % cap for r in range(group)] * num_prompts)
    if same_prompt:
        comp = torch.randint(3, len(tok), (group, cap), generator=gen).repeat(num_prompts, 1)
    else:
        comp = torch.randint(3, len(tok), (n, cap), generator=gen)
        lengths = lengths[torch.randperm(n, generator=gen)]
    ended = lengths < cap
    comp[torch.arange(n)[ended], lengths[ended] - 1] = tok.eos_token_id
    cmask = (torch.arange(cap).unsqueeze(0) < lengths.unsqueeze(1)).long()
    comp = torch.where(cmask.bool(), comp, tok.pad_token_id)
    pids = enc["input_ids"].repeat_interleave(group, 0)
    pmask = enc["attention_mask"].repeat_interleave(group, 0)
    return RolloutBatch(texts=[[""] * group] * num_prompts,
                        input_ids=torch.cat([pids, comp], 1),
                        attention_mask=torch.cat([pmask, cmask], 1),
                        completion_mask=torch.cat([torch.zeros_like(pmask), cmask], 1),
                        completion_lengths=lengths, hit_cap=~ended, group_size=group,
                        num_prompts=num_prompts)


def make_batch(policy, tok, rewards: torch.Tensor, *, seed: int = 0, same_prompt=False):
    b, g = rewards.shape
    if b == 0:
        rollouts = generate(policy, tok, [], group_size=g, temperature=1.0, max_new_tokens=4)
    else:
        rollouts = make_rollouts(tok, b, g, seed=seed, same_prompt=same_prompt)
    ref = reference_logprobs(policy, rollouts)
    return build_grpo_batch(rollouts, rewards.double(), group_advantages(rewards.double()), ref)


def _max_abs(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fast_equals_reference_with_padding(policy, tok):
    rewards = torch.tensor([[1., 0, 0, 1], [0, 0, 0, 1], [1, 1, 1, 0]])
    batch = make_batch(policy, tok, rewards)
    assert len(set(batch.loss_mask.sum(1).tolist())) > 2            # unequal lengths
    assert (batch.attention_mask == 0).any()                         # padding present
    fast = per_prompt_grads_fast(policy, GRPOObjective(), batch)
    ref = per_prompt_grads_reference(policy, GRPOObjective(), batch)
    params = trainable_parameters(policy)
    assert set(fast) == set(params) and len(params) == 28
    for name, p in params.items():
        assert fast[name].shape == (3, *p.shape) and fast[name].dtype == torch.float64
        scale = float(ref[name].abs().max())
        assert scale > 0
        assert float((fast[name] - ref[name]).abs().max()) <= 1e-6 * scale, name
    assert all(p.grad is None for p in policy.parameters())


def test_rows_per_pass_and_dispatch(policy, tok):
    batch = make_batch(policy, tok, torch.tensor([[1., 0, 1], [0, 0, 1], [1, 0, 0]]))
    one = per_prompt_grads_fast(policy, GRPOObjective(), batch)
    split = per_prompt_grads_fast(policy, GRPOObjective(), batch, rows_per_pass=2)
    assert _max_abs(one, split) <= 1e-12
    via = per_prompt_grads(policy, GRPOObjective(), batch, method="reference", rows_per_pass=2)
    assert _max_abs(one, via) <= 1e-12
    with pytest.raises(ConfigError):
        per_prompt_grads(policy, GRPOObjective(), batch, method="per-sample")


@pytest.mark.parametrize("chunk", [1, 2, 4, 8])
def test_rollout_chunked_backward_identity(policy, tok, chunk):
    rewards = torch.tensor([[1., 0, 0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 1]])
    batch = make_batch(policy, tok, rewards, seed=3)
    obj = GRPOObjective()
    for i in range(2):
        loss_full, grad_full = prompt_gradient(policy, obj, batch, i)
        loss_chunk, grad_chunk = prompt_gradient(policy, obj, batch, i, rows_per_pass=chunk)
        torch.testing.assert_close(loss_chunk, loss_full, rtol=1e-6, atol=1e-7)
        for name in grad_full:
            torch.testing.assert_close(grad_chunk[name], grad_full[name], rtol=1e-10,
                                       atol=1e-12)
    chunked = per_prompt_grads_reference(policy, obj, batch, rows_per_pass=chunk)
    fast = per_prompt_grads_fast(policy, obj, batch)
    for name in fast:
        torch.testing.assert_close(chunked[name], fast[name], rtol=1e-10, atol=1e-12)


def test_cross_prompt_isolation_fast_path(policy, tok):
    """Change all of prompt j's rewards: prompt i's gradient is bit-identical."""
    obj = GRPOObjective()
    before_r = torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0]])
    after_r = before_r.clone()
    after_r[1] = torch.tensor([1., 0, 0, 0])                        # prompt j = 1
    before = per_prompt_grads_fast(policy, obj, make_batch(policy, tok, before_r))
    after = per_prompt_grads_fast(policy, obj, make_batch(policy, tok, after_r))
    for name in before:
        assert torch.equal(before[name][0], after[name][0]), name
        assert torch.equal(before[name][2], after[name][2]), name
    assert any(not torch.equal(before[n][1], after[n][1]) for n in before)
    ref_after = per_prompt_grads_reference(policy, obj, make_batch(policy, tok, after_r))
    ref_before = per_prompt_grads_reference(policy, obj, make_batch(policy, tok, before_r))
    assert all(torch.equal(ref_before[n][0], ref_after[n][0]) for n in ref_before)


def test_non_private_equivalence(policy, tok):
    """sum_i g_i / B = gradient of the flat mean of all B*G completion losses (<= 1e-12)."""
    rewards = torch.tensor([[1., 0, 0, 1], [0, 0, 1, 1], [1, 1, 1, 0]])
    batch = make_batch(policy, tok, rewards, seed=5)
    obj = GRPOObjective()
    per_prompt = per_prompt_grads_fast(policy, obj, batch)
    flat = flat_mean_gradient(policy, obj, batch)
    assert _max_abs({k: v.sum(0) / 3 for k, v in per_prompt.items()}, flat) <= 1e-12
    loss = obj.row_losses(policy, batch, slice(0, batch.num_rows)).mean()   # plain backward
    loss.backward()
    try:
        params = trainable_parameters(policy)
        assert max(float((flat[n] - p.grad).abs().max()) for n, p in params.items()) <= 1e-12
    finally:
        policy.zero_grad(set_to_none=True)


def test_zero_advantage_groups_are_kept_and_identical(policy, tok):
    rewards = torch.tensor([[1., 1, 1, 1], [0., 0, 0, 0]])          # all correct, all wrong
    batch = make_batch(policy, tok, rewards, same_prompt=True)
    assert torch.equal(batch.advantages, torch.zeros(2, 4, dtype=torch.float64))
    losses = GRPOObjective().row_losses(policy, batch, slice(0, 8))
    assert torch.isfinite(losses).all() and (losses != 0).any()     # KL term only
    grads = per_prompt_grads_fast(policy, GRPOObjective(), batch)
    for name, g in grads.items():
        assert g.shape[0] == 2 and torch.isfinite(g).all()
        assert torch.equal(g[0], g[1]), name
    assert sum(float(g[0].norm()) for g in grads.values()) > 0
    no_kl = per_prompt_grads_fast(policy, GRPOObjective(beta=0.0), batch)
    assert all(float(g.abs().max()) == 0.0 for g in no_kl.values())


def test_fast_path_rejects_uncovered_parameters(policy, tok):
    batch = make_batch(policy, tok, torch.tensor([[1., 0]]))
    embed = policy.get_input_embeddings().weight
    embed.requires_grad_(True)
    try:
        with pytest.raises(ConfigError, match="no per-prompt hook"):
            per_prompt_grads_fast(policy, GRPOObjective(), batch)
    finally:
        embed.requires_grad_(False)
    assert per_prompt_grads_fast(policy, GRPOObjective(), batch)  # hooks were removed


def test_empty_batch(policy, tok):
    batch = make_batch(policy, tok, torch.zeros(0, 4))
    for fn in (per_prompt_grads_fast, per_prompt_grads_reference):
        grads = fn(policy, GRPOObjective(), batch)
        assert all(g.shape[0] == 0 for g in grads.values()) and len(grads) == 28


# --- record isolation against batch-mates, pass sizes, dropout, checkpointing ---------------

@pytest.fixture(scope="module")
def policy32(tok):
    """fp32 tiny Llama with a nonzero adapter: floating point shows any batch coupling."""
    return tiny_fp32_policy(tok)


def _grpo_batch(model, tok, specs, rewards):
    rollouts = rollouts_from_specs(tok, specs)
    ref = reference_logprobs(model, rollouts, batch_size=2)
    return build_grpo_batch(rollouts, rewards, group_advantages(rewards), ref)


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_batchmates_leave_other_prompts_bit_identical(policy32, tok, method):
    """Adding a much longer prompt (wider rows, more padding for everyone else) and removing
    one changes no other prompt's gradient by a single bit (fp32), nor its reference log-probs."""
    obj = GRPOObjective()
    specs = random_specs(tok, 0, 3)
    longer = random_specs(tok, 1, 1, long=True)
    rewards = torch.tensor([[1., 0, 1], [0, 0, 1], [1, 1, 0]])
    alone = _grpo_batch(policy32, tok, specs, rewards)
    crowded_specs = [specs[0], longer[0], specs[1], specs[2]]
    crowded = _grpo_batch(policy32, tok, crowded_specs,
                          torch.cat([rewards[:1], torch.tensor([[0., 1, 1]]), rewards[1:]]))
    assert crowded.input_ids.shape[1] > alone.input_ids.shape[1] + 20   # much wider rows
    a = per_prompt_grads(policy32, obj, alone, method=method, rows_per_pass=2)
    b = per_prompt_grads(policy32, obj, crowded, method=method, rows_per_pass=2)
    for i, j in ((0, 0), (1, 2), (2, 3)):
        for name in a:
            assert torch.equal(a[name][i], b[name][j]), (i, name)
        ra = alone.ref_logprobs[alone.prompt_rows(i)]
        rb = crowded.ref_logprobs[crowded.prompt_rows(j)]
        assert torch.equal(ra[ra != 0], rb[rb != 0])
    assert float(sum(a[n][0].abs().sum() for n in a)) > 0


def test_rows_per_pass_changes_only_summation_order(policy, tok):
    """fp64: any pass size gives the same per-prompt gradients to 1e-12."""
    rewards = torch.tensor([[1., 0, 0, 1, 1], [0, 1, 0, 0, 0], [1, 1, 1, 0, 1]])
    batch = make_batch(policy, tok, rewards, seed=9)
    whole = per_prompt_grads(policy, GRPOObjective(), batch, rows_per_pass=5)
    for rows in (1, 2, 3, 64):
        for method in ("fast", "reference"):
            part = per_prompt_grads(policy, GRPOObjective(), batch, method=method,
                                    rows_per_pass=rows)
            assert _max_abs(part, whole) <= 1e-12, (rows, method)


def _with_recording_dropout(model, p: float):
    """Replace every LoRA dropout by the fast path's recording dropout (same RNG draws)."""
    from dpgrpo.training.lora_hooks import _RecordingDropout

    saved = []
    for module in model.modules():
        if isinstance(getattr(module, "lora_dropout", None), torch.nn.ModuleDict):
            for name, d in module.lora_dropout.items():
                saved.append((module.lora_dropout, name, d))
                module.lora_dropout[name] = _RecordingDropout(p, lambda m: None)
    return saved


def _dropout_model(tok, p: float = 0.3, train: str = "all"):
    base = build_tiny_model(tok, dtype="float64")
    exact_rmsnorm(base)
    model = attach_lora(base, LoraSettings(dropout=p, train=train))
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "lora_B" in name:
                prm.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(5))
    return model


@pytest.mark.parametrize("train", ["all", "B"])
def test_fast_path_with_lora_dropout_equals_autograd(tok, train):
    """With dropout active, the hooks' rebuilt dropped inputs give autograd's gradients, also
    with lora_A frozen (whose hook still applies dropout's scale)."""
    model = _dropout_model(tok, train=train)
    rewards = torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1]])
    batch = make_batch(model.eval(), tok, rewards, seed=2)
    model.train()
    fast = per_prompt_grads(model, GRPOObjective(), batch, method="fast", rows_per_pass=2,
                            dropout_seeds=[11, 22])
    saved = _with_recording_dropout(model, 0.3)
    try:                                           # the same masks: the same seeds
        ref = per_prompt_grads(model, GRPOObjective(), batch, method="reference",
                               rows_per_pass=2, dropout_seeds=[11, 22])
    finally:
        for container, name, d in saved:
            container[name] = d
    other = per_prompt_grads(model, GRPOObjective(), batch, method="fast", rows_per_pass=2,
                             dropout_seeds=[11, 23])
    assert _max_abs(fast, ref) <= 1e-12
    assert all(torch.equal(fast[n][0], other[n][0]) for n in fast)   # prompt 0: same seed
    assert max(float((fast[n][1] - other[n][1]).abs().max()) for n in fast) > 1e-6  # it acted
    assert all(isinstance(d, torch.nn.Dropout) for *_, d in saved)   # originals restored
    assert all(p.requires_grad == (train == "all" or "lora_B" in n)
               for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_dropout_masks_are_bound_to_the_prompt(tok, method):
    """Issue 32, defect 1: with LoRA dropout on (train mode), a prompt's gradient is
    bit-identical whatever its batch-mates and its position, given its own dropout seed; the
    run's global generator is neither read nor advanced. (Masks drawn in order from one
    generator, as before, moved every later prompt's gradient when a prompt was added first.)"""
    model = _dropout_model(tok).train()
    obj = GRPOObjective()
    specs, extra = random_specs(tok, 0, 3), random_specs(tok, 1, 1, long=True)
    rewards = torch.tensor([[1., 0, 1], [0, 0, 1], [1, 1, 0]], dtype=torch.float64)
    alone = _grpo_batch(model, tok, specs, rewards)
    crowded = _grpo_batch(model, tok, [extra[0], specs[2], specs[0], specs[1]],
                          rewards[[0, 2, 0, 1]])
    seeds = [2**255 + 1, 2**200 + 7, 12345]
    state = torch.get_rng_state()
    a = per_prompt_grads(model, obj, alone, method=method, rows_per_pass=2, dropout_seeds=seeds)
    b = per_prompt_grads(model, obj, crowded, method=method, rows_per_pass=2,
                         dropout_seeds=[99, seeds[2], seeds[0], seeds[1]])
    assert torch.equal(torch.get_rng_state(), state)          # the global stream untouched
    for i, j in ((0, 2), (1, 3), (2, 1)):
        assert all(torch.equal(a[n][i], b[n][j]) for n in a), (i, j)
    c = per_prompt_grads(model, obj, alone, method=method, rows_per_pass=2,
                         dropout_seeds=[seeds[0] + 1, *seeds[1:]])
    assert max(float((a[n][0] - c[n][0]).abs().max()) for n in a) > 1e-6   # masks matter
    assert all(torch.equal(a[n][1], c[n][1]) for n in a)
    with pytest.raises(PrivacyError):
        per_prompt_grads(model, obj, alone, method=method, dropout_seeds=seeds[:2])


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_gradient_checkpointing_keeps_gradients_exact(tok, method):
    from dpgrpo.model import enable_gradient_checkpointing

    base = build_tiny_model(tok, dtype="float64")
    exact_rmsnorm(base)
    model = attach_lora(base, LoraSettings(dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(6))
    batch = make_batch(model.eval(), tok, torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1]]), seed=4)
    plain = per_prompt_grads(model.train(), GRPOObjective(), batch, method="reference")
    enable_gradient_checkpointing(model)
    lm = model.get_base_model()
    assert getattr(lm, "is_activation_checkpointing", None) or lm.is_gradient_checkpointing
    checkpointed = per_prompt_grads(model, GRPOObjective(), batch, method=method,
                                    rows_per_pass=2)
    assert _max_abs(checkpointed, plain) <= 1e-12


# --- each prompt's pass over its prompt shared by its G rows ---------------------------------

def _embedding_calls(model):
    """Record the (rows, columns) of every decoder pass."""
    calls = []
    handle = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: calls.append(tuple(args[0].shape)))
    return calls, handle


def test_shared_prompt_runs_each_prompt_once_with_the_same_values(policy, tok):
    """token_logprobs(group_size=G): one pass over each prompt (1 row), one over the G rows'
    completions, and the log-probs of one pass over the whole rows to 1e-12 (fp64)."""
    from dpgrpo.objectives.logprobs import shared_prompt_end, token_logprobs

    ro = make_rollouts(tok, 3, 4, seed=5)
    start = int(ro.completion_mask.bool().any(0).long().argmax())
    assert (ro.attention_mask[:, :start] == 0).any()                 # left-padded prompts
    assert shared_prompt_end(ro.input_ids, ro.attention_mask, ro.completion_mask.bool(), 4) == start
    assert shared_prompt_end(ro.input_ids, ro.attention_mask, ro.completion_mask.bool(), 6) == 0
    assert shared_prompt_end(ro.input_ids, ro.attention_mask, ro.completion_mask.bool(), 1) == 0
    mixed = ro.input_ids.clone()
    mixed[1, start - 1] = (mixed[1, start - 1] + 1) % len(tok)       # row 1: another prompt
    assert shared_prompt_end(mixed, ro.attention_mask, ro.completion_mask.bool(), 4) == 0
    with torch.no_grad():
        full = token_logprobs(policy, ro.input_ids, ro.attention_mask, mask=ro.completion_mask)
        calls, handle = _embedding_calls(policy)
        try:
            shared = token_logprobs(policy, ro.input_ids, ro.attention_mask,
                                    mask=ro.completion_mask, group_size=4)
        finally:
            handle.remove()
    width = ro.input_ids.shape[1]
    assert calls == [(3, start), (12, width - start)]
    assert torch.equal(shared == 0, full == 0)
    assert float((shared - full).abs().max()) <= 1e-12
    with torch.no_grad():                                             # not one prompt: no sharing
        calls, handle = _embedding_calls(policy)
        try:
            token_logprobs(policy, mixed, ro.attention_mask, mask=ro.completion_mask, group_size=4)
        finally:
            handle.remove()
    assert calls == [(12, width)]


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_shared_prompt_gives_the_full_forwards_gradients(policy, tok, monkeypatch, method):
    """Per-prompt gradients through the shared prompt pass (backward reaches the prompt's
    keys and values through the cache) equal those of a full forward per row, fp64."""
    import dpgrpo.objectives.logprobs as logprobs

    batch = make_batch(policy, tok, torch.tensor([[1., 0, 0, 1], [0, 1, 1, 1], [1, 0, 1, 0]]),
                       seed=8)
    calls, handle = _embedding_calls(policy)
    try:
        shared = per_prompt_grads(policy, GRPOObjective(), batch, method=method)
    finally:
        handle.remove()
    assert calls and all(rows == 1 for rows, _ in calls[::2])       # each prompt once
    monkeypatch.setattr(logprobs, "shared_prompt_end", lambda *args: 0)
    full = per_prompt_grads(policy, GRPOObjective(), batch, method=method)
    scale = max(float(v.abs().max()) for v in full.values())
    assert scale > 0
    assert _max_abs(shared, full) <= 1e-10 * scale
    ref_full = reference_logprobs(policy, batch)
    assert float((ref_full - batch.ref_logprobs).abs().max()) <= 1e-12


def test_gradient_checkpointing_turns_prompt_sharing_off(tok):
    """Under gradient checkpointing transformers drops the cache: every row runs whole."""
    from dpgrpo.model import enable_gradient_checkpointing

    base = build_tiny_model(tok, dtype="float64")
    model = attach_lora(base, LoraSettings(dropout=0.0))
    enable_gradient_checkpointing(model)
    batch = make_batch(model.eval(), tok, torch.tensor([[1., 0, 0, 1]]), seed=4)
    calls, handle = _embedding_calls(model)
    try:
        per_prompt_grads(model.train(), GRPOObjective(), batch, method="reference")
    finally:
        handle.remove()
    assert calls == [tuple(batch.input_ids.shape)]


# --- where the fast path's backward starts ------------------------------------------------------

@pytest.fixture(scope="module")
def upper_policy(tok):
    """fp32 tiny Llama of 4 layers with LoRA on the top two only (as the CPU study's last 6)."""
    base = build_tiny_model(tok, layers=4)
    return _random_lora_b(attach_lora(base, LoraSettings(dropout=0.0, layers=(-2, -1))), seed=5)


def _decoder_layers(model):
    return model.get_base_model().model.layers


def test_backward_starts_at_the_first_adapted_layer(upper_policy, tok, monkeypatch):
    """With LoRA on layers 2-3 of 4, no backward runs through layers 0-1, and the per-prompt
    gradients are the same bits as with the backward from the embeddings (the old start)."""
    from dpgrpo.training import lora_hooks

    layers = _decoder_layers(upper_policy)
    assert lora_hooks.first_adapted_layer(upper_policy) is layers[2]
    batch = _grpo_batch(upper_policy, tok, random_specs(tok, 0, 3),
                        torch.tensor([[1., 0, 1], [0, 0, 1], [1, 1, 0]]))
    calls: list[int] = []
    handles = [layer.register_full_backward_hook(lambda m, gi, go, i=i: calls.append(i))
               for i, layer in enumerate(layers)]
    try:
        new = per_prompt_grads_fast(upper_policy, GRPOObjective(), batch)
        assert calls and set(calls) == {2, 3}                  # 0 and 1: no backward
        calls.clear()
        monkeypatch.setattr(lora_hooks, "first_adapted_layer", lambda model: None)
        old = per_prompt_grads_fast(upper_policy, GRPOObjective(), batch)
        assert set(calls) == {0, 1, 2, 3}                      # the embeddings' start: all four
    finally:
        for h in handles:
            h.remove()
    assert set(new) == set(old) and all(torch.equal(new[k], old[k]) for k in new)
    assert any(float(v.abs().max()) > 0 for v in new.values())
    ref = per_prompt_grads_reference(upper_policy, GRPOObjective(), batch)
    for name in ref:
        torch.testing.assert_close(new[name], ref[name], rtol=1e-4, atol=1e-6)


def test_backward_start_falls_back_to_the_embeddings(policy, tok):
    """LoRA from layer 0, or gradient checkpointing (its recomputation would replay the
    hook): the backward starts at the embeddings, or at the lowest adapted layer."""
    from dpgrpo.training.lora_hooks import first_adapted_layer

    assert first_adapted_layer(policy) is _decoder_layers(policy)[0]
    plain = build_tiny_model(tok)
    assert first_adapted_layer(plain) is None                  # no LoRA layer at all
    model = attach_lora(build_tiny_model(tok, layers=4), LoraSettings(layers=(-1,)))
    assert first_adapted_layer(model) is _decoder_layers(model)[3]
    model.get_base_model().gradient_checkpointing_enable()
    assert first_adapted_layer(model) is None
