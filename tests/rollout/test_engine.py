"""The transformers engine: same completions as ``model.generate`` where both are deterministic,
per-prompt coins, record isolation, dropping finished rows changes nothing, call planning."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.rollout import RolloutBatch, generate, hf_generate, make_engine
from dpgrpo.rollout import decode as decode_module
from dpgrpo.rollout.engine import plan_calls
from dpgrpo.rollout.factory import isolation_statement
from dpgrpo.verify.fixtures import tiny_fp64_policy

MSGS = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more. How many are there now, Tom?",
        "Add 5 and 9."]


@pytest.fixture(scope="module")
def policy():
    return tiny_fp64_policy()                      # fp64 LoRA policy: ties are not an issue


@contextlib.contextmanager
def _stop_after(model, tok, modulus: int):
    """EOS becomes certain right after a generated token id divisible by ``modulus``, so rows
    stop at different, input-determined steps (the same rule for every engine)."""
    seen = {}
    base = model.get_base_model()

    def remember(module, args):
        seen["ids"] = args[0]

    def force(module, args, output):
        ids = seen["ids"]
        if ids.shape[1] != 1:                       # prefill: the template's last token
            return output
        output = output.clone()          # arithmetic, no boolean indexing: a CUDA graph
        output[:, -1, tok.eos_token_id] += 1e4 * (ids[:, -1] % modulus == 0).to(output.dtype)
        return output                    # records it (indexing by a mask would synchronise)

    handles = [base.model.embed_tokens.register_forward_pre_hook(remember),
               base.lm_head.register_forward_hook(force)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _rows(ro: RolloutBatch, i: int) -> list[list[int]]:
    g = ro.group_size
    return [ids[m.bool()].tolist() for ids, m in
            zip(ro.input_ids[i * g:(i + 1) * g], ro.attention_mask[i * g:(i + 1) * g])]


@pytest.mark.parametrize("isolated,rows", [(False, None), (False, 4), (True, None), (True, 1)])
def test_greedy_equals_model_generate(policy, check_rollouts, isolated, rows):
    """Prompts of different lengths (left padding), one prefill per prompt copied to its rows,
    the preallocated cache and row dropping reproduce ``model.generate`` token for token."""
    model, tok = policy
    kw = dict(group_size=2, temperature=0.0, max_new_tokens=12, batch_size=rows,
              isolated=isolated)
    with _stop_after(model, tok, 4):
        new, old = generate(model, tok, MSGS, **kw), hf_generate(model, tok, MSGS, **kw)
    check_rollouts(new, tok, 12)
    assert torch.equal(new.input_ids, old.input_ids)
    assert torch.equal(new.completion_mask, old.completion_mask)
    assert new.texts == old.texts
    assert new.hit_cap.any() and (~new.hit_cap).any()       # rows stopped at different steps


def test_dropping_finished_rows_changes_nothing(policy, monkeypatch):
    """Compacting the batch after every finished row, or never, gives the same samples."""
    model, tok = policy
    kw = dict(group_size=5, temperature=1.0, max_new_tokens=10, seeds=[3, 4, 5])
    runs = []
    with _stop_after(model, tok, 4):
        for compact in (1, 1_000_000):             # compact at any finished row / never
            monkeypatch.setattr(decode_module, "COMPACT", compact)
            runs.append(generate(model, tok, MSGS, **kw))
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    lengths = runs[0].completion_lengths
    assert len(set(lengths.tolist())) > 2                   # rows really ended apart


def test_preallocated_cache_matches_dynamic_cache(policy, monkeypatch):
    from transformers import DynamicCache

    model, tok = policy
    kw = dict(group_size=3, temperature=0.9, max_new_tokens=8, seeds=[1, 2, 3])
    fast = generate(model, tok, MSGS, **kw)
    monkeypatch.setattr(decode_module, "new_cache",
                        lambda model, capacity, layer=None: DynamicCache())
    plain = generate(model, tok, MSGS, **kw)
    assert torch.equal(fast.input_ids, plain.input_ids)


def test_first_token_follows_the_tempered_distribution(policy):
    """1,000 coins on one prompt: the first token's frequencies fit softmax(logits / T)
    (chi-square over the 4 likeliest tokens and the rest, expected counts >= 15)."""
    from scipy.stats import chisquare

    model, tok = policy
    ro = generate(model, tok, MSGS[:1], group_size=1000, temperature=0.1, max_new_tokens=1,
                  seeds=[11])
    with torch.no_grad():
        logits = model(input_ids=ro.input_ids[:1, :-1]).logits[0, -1].double()
    probs = (logits / 0.1).softmax(-1)
    top = probs.argsort(descending=True)[:4]
    counts = torch.bincount(ro.input_ids[:, -1], minlength=probs.numel()).double()
    observed = torch.cat([counts[top], (1000 - counts[top].sum()).reshape(1)])
    expected = torch.cat([probs[top], (1 - probs[top].sum()).reshape(1)]) * 1000
    assert expected.min() >= 15
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3
    assert len(set(ro.texts[0])) > 20                       # the coins differ row to row
    assert counts[top[0]] < 200                             # not greedy (p = 0.11)


def _pair_fit(ro, probs_of, pairs, n):
    """Chi-square p-value of the (first, second) completion tokens of ``ro`` against the exact
    probabilities ``probs_of`` of ``pairs`` (the rest merged into one bin)."""
    from scipy.stats import chisquare

    first = int((ro.completion_mask.sum(0) > 0).nonzero()[0])
    drawn = [tuple(r) for r in ro.input_ids[:, first:first + 2].tolist()]
    observed = [sum(d == p for d in drawn) for p in pairs]
    expected = [probs_of[p] * n for p in pairs]
    observed.append(n - sum(observed))
    expected.append(n - sum(expected))
    assert min(expected) >= 15
    return chisquare(observed, expected).pvalue


def test_two_token_completions_follow_the_model_as_multinomial_sampling_does(policy):
    """1,200 two-token completions of one prompt, by the engine's coins and by
    ``model.generate`` (torch.multinomial): both fit the exact joint softmax(logits / T) of the
    likeliest pairs, p(x1) p(x2 | x1) from clean forward passes, so the second step reads the
    cache, positions and a fresh coin as a single forward pass would."""
    model, tok = policy
    n, t = 1200, 0.04
    kw = dict(group_size=n, temperature=t, max_new_tokens=2)
    ours = generate(model, tok, MSGS[:1], seeds=[21], **kw)
    theirs = hf_generate(model, tok, MSGS[:1], generator=torch.Generator().manual_seed(5), **kw)
    prompt = ours.input_ids[:1, :int((ours.completion_mask[0] > 0).nonzero()[0])]
    with torch.no_grad():
        p1 = (model(input_ids=prompt).logits[0, -1].double() / t).softmax(-1)
        probs_of = {}
        for x1 in p1.argsort(descending=True)[:2].tolist():
            ids = torch.cat([prompt, torch.tensor([[x1]])], dim=1)
            p2 = (model(input_ids=ids).logits[0, -1].double() / t).softmax(-1)
            for x2 in p2.argsort(descending=True)[:6].tolist():
                probs_of[(x1, x2)] = float(p1[x1] * p2[x2])
    pairs = [p for p in probs_of if probs_of[p] * n >= 15]
    assert len(pairs) >= 4
    assert _pair_fit(theirs, probs_of, pairs, n) > 1e-3         # the reference is right
    assert _pair_fit(ours, probs_of, pairs, n) > 1e-3


def test_batched_mode_gives_each_prompt_its_own_coins(policy):
    """With the prompt's seed fixed, its completions are the same alone or next to a longer
    prompt, in batched mode too (fp64: no kernel difference flips a token here)."""
    model, tok = policy
    kw = dict(group_size=3, temperature=1.0, max_new_tokens=8)
    alone = generate(model, tok, MSGS[:1], seeds=[5], **kw)
    crowd = generate(model, tok, [MSGS[2], MSGS[0] * 4, MSGS[0]], seeds=[6, 7, 5], **kw)
    assert crowd.input_ids.shape[1] > alone.input_ids.shape[1]         # padded together
    assert _rows(alone, 0) == _rows(crowd, 2)
    old_alone = hf_generate(model, tok, MSGS[:1], seeds=[5], **kw)       # the old loop: not so
    old_crowd = hf_generate(model, tok, [MSGS[2], MSGS[0] * 4, MSGS[0]], seeds=[6, 7, 5], **kw)
    assert _rows(old_alone, 0) != _rows(old_crowd, 2)


@contextlib.contextmanager
def _couple_rows(model):
    """A deliberately batch-variant kernel: every row's logits move by the batch's mean logits,
    so a row's tokens depend on whichever rows share its forward pass."""
    def hook(module, args, output):
        return output + 3.0 * output.mean(dim=0, keepdim=True)

    handle = model.get_base_model().lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_isolated_mode_survives_a_batch_variant_kernel(policy):
    """Record isolation (A2) with a kernel that couples rows: in isolated mode a prompt's
    completions are the same alone or among other prompts; in batched mode they change."""
    model, tok = policy
    kw = dict(group_size=3, temperature=1.0, max_new_tokens=8)
    crowd_msgs, crowd_seeds = [MSGS[2], MSGS[0] * 4, MSGS[0]], [6, 7, 5]
    with _couple_rows(model):
        for isolated in (True, False):
            engine = make_engine("transformers", model, tok, isolated=isolated, rows_per_call=9)
            alone = engine.generate(MSGS[:1], seeds=[5], **kw)
            crowd = engine.generate(crowd_msgs, seeds=crowd_seeds, **kw)
            assert (_rows(alone, 0) == _rows(crowd, 2)) is isolated


def test_isolated_calls_hold_one_prompt(policy, monkeypatch):
    """Every decode call of isolated mode sees one prompt (unpadded); batched mode packs them."""
    from dpgrpo.rollout import transformers_engine

    model, tok = policy
    seen, real = [], transformers_engine.decode

    def spy(model, prompts, row_prompt, *args, **kwargs):
        seen.append((len(prompts), len(row_prompt)))
        return real(model, prompts, row_prompt, *args, **kwargs)

    monkeypatch.setattr(transformers_engine, "decode", spy)
    kw = dict(group_size=2, temperature=1.0, max_new_tokens=3, seeds=[1, 2, 3])
    make_engine("transformers", model, tok, isolated=True, rows_per_call=6).generate(MSGS, **kw)
    assert seen == [(1, 2)] * 3
    seen.clear()
    make_engine("transformers", model, tok, isolated=False, rows_per_call=6).generate(MSGS, **kw)
    assert seen == [(3, 6)]


def test_adapter_switch(policy):
    model, tok = policy
    engine = make_engine("transformers", model, tok)
    kw = dict(group_size=2, temperature=0.0, max_new_tokens=6)
    tuned, base = engine.generate(MSGS, **kw), engine.generate(MSGS, use_adapter=False, **kw)
    with model.disable_adapter():
        expected = engine.generate(MSGS, **kw)
    assert torch.equal(base.input_ids, expected.input_ids)
    assert not torch.equal(tuned.input_ids, base.input_ids)
    with pytest.raises(ConfigError, match="LoRA adapter"):
        make_engine("transformers", model.get_base_model(), tok).generate(
            MSGS, use_adapter=False, **kw)


def test_repetition_penalty_and_top_p_match_transformers(policy):
    """The DIBA sampler: greedy under a repetition penalty equals ``model.generate``'s, and
    top-p keeps the draws inside the nucleus."""
    model, tok = policy
    kw = dict(group_size=1, temperature=0.0, max_new_tokens=10, repetition_penalty=1.8,
              isolated=True)
    assert generate(model, tok, MSGS, **kw).texts == hf_generate(model, tok, MSGS, **kw).texts
    ro = generate(model, tok, MSGS[:1], group_size=200, temperature=1.0, max_new_tokens=1,
                  top_p=0.3, seeds=[2])
    with torch.no_grad():
        probs = model(input_ids=ro.input_ids[:1, :-1]).logits[0, -1].softmax(-1)
    order = probs.argsort(descending=True)
    nucleus = order[:int((probs[order].cumsum(0) < 0.3).sum()) + 1]
    assert set(ro.input_ids[:, -1].tolist()) <= set(nucleus.tolist())


def test_plan_calls():
    lengths = [9, 3, 7, 5]
    iso = plan_calls(lengths, 3, 2, isolated=True)
    assert iso == [[0, 1], [2], [3, 4], [5], [6, 7], [8], [9, 10], [11]]
    batched = plan_calls(lengths, 3, 7, isolated=False)      # 2 whole groups per call
    assert batched == [[3, 4, 5, 9, 10, 11], [6, 7, 8, 0, 1, 2]]   # sorted by length
    assert plan_calls(lengths, 3, None, isolated=False) == [[3, 4, 5, 9, 10, 11, 6, 7, 8,
                                                               0, 1, 2]]
    assert plan_calls(lengths, 3, None, isolated=True) == [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                                           [9, 10, 11]]
    for calls in (iso, batched, plan_calls(lengths, 3, 2, isolated=False)):
        assert sorted(r for c in calls for r in c) == list(range(12))
        assert all(len(c) <= 7 for c in calls)
    assert all(len({r // 3 for r in c}) == 1 for c in iso)


def test_engine_names_and_statements(policy):
    model, tok = policy
    with pytest.raises(ConfigError, match="one of transformers, vllm"):
        make_engine("llama.cpp", model, tok)
    engine = make_engine("transformers", model, tok, isolated=True)
    assert engine.isolation == isolation_statement("transformers", "isolated")
    assert "alone" in engine.isolation
    assert "A2 gap" in isolation_statement("transformers", "batched")
    assert "A2 gap" in isolation_statement("vllm", "batched")
    assert "prefix caching off" in isolation_statement("vllm", "isolated")


def test_grouped_decode_attention_equals_repeated_heads():
    """One query token per row: grouping the query heads over their shared key/value head gives
    transformers' repeat_kv + sdpa result (fp64), with a padding mask and without."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import repeat_kv

    from dpgrpo.rollout.attention import grouped_decode_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 6, 1, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(3, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.zeros(3, 1, 1, 7, dtype=torch.float64)
    mask[0, ..., :3] = torch.finfo(torch.float64).min                # left padding of row 0
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    for m in (mask, None):
        out, _ = grouped_decode_attention(module, q, k, v, m, scaling=0.3)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=m, scale=0.3).transpose(1, 2)
        assert out.shape == (3, 1, 6, 8)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    masked = grouped_decode_attention(module, q, k.clone().index_fill_(2, torch.tensor([0]), 9.0),
                                      v, mask, scaling=0.3)[0]
    assert torch.equal(masked[0], grouped_decode_attention(module, q, k, v, mask,
                                                           scaling=0.3)[0][0])  # pad unseen


def test_decoding_steps_use_grouped_attention(policy, monkeypatch):
    """The tiny model has 4 query heads over 2 key/value heads: its decoding steps go through the
    grouped function (and the prefill does not), with the same samples as without it."""
    from dpgrpo.rollout import attention

    model, tok = policy
    kw = dict(group_size=3, temperature=1.0, max_new_tokens=6, seeds=[1, 2, 3])
    calls = []
    original = attention.grouped_decode_attention

    def spy(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "grouped_decode_attention", spy)
    monkeypatch.setattr(attention, "_REGISTERED", False)      # re-register the spy
    grouped = generate(model, tok, MSGS, **kw)
    assert calls and set(calls[-5:]) == {1} and max(calls) > 1   # prefill falls through
    assert model.get_base_model().config._attn_implementation == "sdpa"   # restored after
    monkeypatch.setattr(decode_module, "grouped_decoding",
                        lambda m: contextlib.nullcontext(False))
    plain = generate(model, tok, MSGS, **kw)
    assert torch.equal(grouped.input_ids, plain.input_ids)
    monkeypatch.undo()
    attention._REGISTERED = False                                 # re-register the original


def test_reading_the_live_count_every_k_steps_changes_nothing(policy, monkeypatch):
    """Rows that finish between two reads of the live count only produce padding."""
    model, tok = policy
    kw = dict(group_size=4, temperature=1.0, max_new_tokens=12, seeds=[7, 8, 9])
    runs = []
    original = decode_module.decode
    with _stop_after(model, tok, 4):
        for every in (1, 5):
            monkeypatch.setattr(decode_module, "decode",
                                lambda *a, every=every, **k: original(*a, check_every=every, **k))
            import dpgrpo.rollout.transformers_engine as te
            monkeypatch.setattr(te, "decode", decode_module.decode)
            runs.append(generate(model, tok, MSGS, **kw))
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    assert len(set(runs[0].completion_lengths.tolist())) > 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_steps_equal_dynamic_steps(policy, monkeypatch, temperature):
    """The constant-shape step (the one a CUDA graph replays; eager here) writes each key/value
    at the device-held column and opens it in the mask: the same samples as the growing cache,
    for left-padded prompts whose rows stop at different steps."""
    import dpgrpo.rollout.transformers_engine as te

    model, tok = policy
    kw = dict(group_size=3, temperature=temperature, max_new_tokens=10, seeds=[4, 5, 6])
    original, runs, layers = decode_module.decode, [], []
    spy_new_cache = decode_module.new_cache

    def recording_cache(*args, **kwargs):
        cache = spy_new_cache(*args, **kwargs)
        layers.append(type(cache.layers[0]).__name__)
        return cache

    monkeypatch.setattr(decode_module, "new_cache", recording_cache)
    with _stop_after(model, tok, 4):
        for static in (False, True):
            monkeypatch.setattr(te, "decode", lambda *a, static=None, forced=static, **k:
                                original(*a, static=forced, check_every=3, **k))
            runs.append(generate(model, tok, MSGS, **kw))
    assert layers == ["PreallocatedLayer", "StaticLayer"]
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    assert torch.equal(runs[0].completion_mask, runs[1].completion_mask)
    assert len(set(runs[0].completion_lengths.tolist())) > 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_static_cache_columns_start_at_zero(device):
    """The constant-shape step attends over every column; unwritten ones must be zeros (a
    masked column has weight 0, but 0 * NaN from stale memory is NaN). Once frozen, each write
    lands at the column held in the device tensor ``slot`` and the whole allocation is read."""
    layer = decode_module.StaticLayer(12)
    k = torch.randn(2, 2, 5, 4, dtype=torch.float64, device=device)
    layer.update(k, k.clone())
    layer.batch_select_indices(torch.tensor([0, 0, 1], device=device))
    assert layer._k.shape == (3, 2, 12, 4) and layer._k.device.type == device
    assert torch.equal(layer._k[:, :, 5:], torch.zeros_like(layer._k[:, :, 5:]))
    assert torch.equal(layer._k[:, :, :5], k[[0, 0, 1]])
    slot = torch.tensor([5], device=device)
    layer.freeze(slot)
    new = torch.randn(3, 2, 1, 4, dtype=torch.float64, device=device)
    keys, values = layer.update(new, -new)
    assert keys.shape == (3, 2, 12, 4)                      # the whole allocation
    assert torch.equal(keys[:, :, 5:6], new) and torch.equal(values[:, :, 5:6], -new)
    assert torch.equal(keys[:, :, 6:], torch.zeros_like(keys[:, :, 6:]))


# --- CUDA graphs (run by ``pytest -m cuda`` on a GPU; skipped elsewhere) ---------------------

def _graph_step(forward, rows: int = 3, width: int = 4, vocab: int = 5):
    from dpgrpo.rollout.graphs import StaticStep

    mask = torch.ones((rows, width), dtype=torch.long, device="cuda")
    return StaticStep(forward, [], mask, torch.full((rows,), width, device="cuda"),
                      width + 6, torch.float32)


@pytest.mark.cuda
def test_a_captured_step_replays_the_eager_step_and_advances_its_state():
    """capture() warms up, restores the state, records, checks one replay against the eager
    step and restores again: replays then give the positions 4, 5, 6 the eager step would."""
    from dpgrpo.rollout.graphs import capture

    ones = torch.ones((1, 5), device="cuda")
    step = _graph_step(lambda tokens, position, mask: position.float() * ones)  # (rows, V)
    replay = capture(step)
    seen = [replay()[:, 0].tolist() for _ in range(3)]
    assert seen == [[4.0] * 3, [5.0] * 3, [6.0] * 3]
    assert int(step.slot) == 7 and bool((step.mask[:, 0, 0, :7] == 0).all())


@pytest.mark.cuda
def test_capture_refuses_a_step_that_depends_on_host_state():
    """A forward that reads Python-side state replays whatever it read at capture time; the
    check against the eager step catches it (GraphMismatch) instead of decoding garbage."""
    from dpgrpo.rollout.graphs import GraphMismatch, capture

    table = torch.arange(40.0, device="cuda").reshape(8, 1, 5).expand(8, 3, 5).contiguous()
    calls = iter(range(8))
    step = _graph_step(lambda tokens, position, mask: table[next(calls)] * 1.0)
    with pytest.raises(GraphMismatch):
        capture(step)


@pytest.fixture(scope="module")
def cuda_policy():
    model, tok = tiny_fp64_policy()
    return model.to("cuda"), tok


@pytest.mark.cuda
@pytest.mark.parametrize("isolated", [False, True])
def test_cuda_graph_decoding_equals_the_dynamic_decoder(cuda_policy, monkeypatch, isolated):
    """On CUDA, decoding replayed from captured graphs (the default there) samples the same
    completions as the growing-cache decoder, with rows stopping at different steps."""
    import dpgrpo.rollout.graphs as graphs
    import dpgrpo.rollout.transformers_engine as te

    model, tok = cuda_policy
    kw = dict(group_size=3, temperature=1.0, max_new_tokens=10, seeds=[4, 5, 6],
              isolated=isolated)
    original, runs, captured = decode_module.decode, [], []
    real_capture = graphs.capture
    monkeypatch.setattr(decode_module, "capture",
                        lambda step: captured.append(step) or real_capture(step))
    with _stop_after(model, tok, 4):
        for static in (False, None):                        # None: the CUDA default (graphs)
            monkeypatch.setattr(te, "decode", lambda *a, static=None, forced=static, **k:
                                original(*a, static=forced, **k))
            runs.append(generate(model, tok, MSGS, **kw))
    assert captured, "the default decoder on CUDA did not capture a graph"
    assert torch.equal(runs[0].input_ids.cpu(), runs[1].input_ids.cpu())
    assert torch.equal(runs[0].completion_mask.cpu(), runs[1].completion_mask.cpu())
    assert len(set(runs[0].completion_lengths.tolist())) > 1


def test_a_merged_adapter_decodes_the_same_and_leaves_every_weight_as_it_was():
    """On the CPU the engine decodes with W + scale B A as each adapted layer's weight. Its
    logits equal the LoRA path's up to rounding, its greedy and sampled completions are the
    same, and afterwards the base weights are the same tensors, bit for bit, the adapter is on
    again and its parameters still train."""
    from dpgrpo.rollout.transformers_engine import TransformersEngine, merged_adapter

    model, tok = tiny_fp64_policy(seed=3, lora_scale=0.5)
    bases = {n: (p, p.detach().clone()) for n, p in model.named_parameters() if "lora" not in n}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        lora_path = model(input_ids=ids).logits
        with merged_adapter(model):
            merged = model(input_ids=ids).logits
            swapped = [n for n, p in model.named_parameters()
                       if n in bases and p is not bases[n][0]]
        with model.disable_adapter():
            base_only = model(input_ids=ids).logits
    assert swapped and (merged - lora_path).abs().max() < 1e-12     # fp64: rounding only
    assert (lora_path - base_only).abs().max() > 1e-3               # the adapter does something
    for name, p in model.named_parameters():
        if name in bases:
            assert p is bases[name][0] and torch.equal(p, bases[name][1]), name
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, lora_path)   # the LoRA path is back
    kw = dict(group_size=3, temperature=0.7, max_new_tokens=6, seeds=[11, 12, 13])
    on = TransformersEngine(model, tok, merge_adapter=True).generate(MSGS, **kw)
    off = TransformersEngine(model, tok, merge_adapter=False).generate(MSGS, **kw)
    assert torch.equal(on.input_ids, off.input_ids) and on.texts == off.texts
