"""Rollouts: masks and lengths, EOS stops, the cap, generator-only randomness, empty rounds."""

from __future__ import annotations

import pytest
import torch

from dpgrpo.errors import ConfigError
from dpgrpo.rollout import RolloutBatch, generate
from dpgrpo.verify.fixtures import build_tiny_model, build_tiny_tokenizer

MSGS = ["What is 12 plus 30?", "Tom has 3 apples and buys 4 more. How many?"]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok)


def _eos_bias(model, tok, bias: float):
    """Add ``bias`` to the EOS logit so the random tiny model ends some completions."""
    def hook(module, args, output):
        output = output.clone()
        output[..., tok.eos_token_id] += bias
        return output
    return model.lm_head.register_forward_hook(hook)


def test_shapes_masks_and_prompt_major_order(model, tok, check_rollouts):
    ro = generate(model, tok, MSGS, group_size=3, temperature=1.0, max_new_tokens=8,
                  generator=torch.Generator().manual_seed(0))
    assert ro.num_prompts == 2 and ro.group_size == 3 and ro.num_rows == 6
    check_rollouts(ro, tok, 8)
    prompts = [tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                       add_generation_prompt=True) for m in MSGS]
    prompt_part = ro.attention_mask.bool() & ~ro.completion_mask.bool()
    for row in range(6):
        assert tok.decode(ro.input_ids[row][prompt_part[row]]) == prompts[row // 3]


def test_eos_stops_and_cap_flags(model, tok, check_rollouts):
    handle = _eos_bias(model, tok, 4.0)
    try:
        ro = generate(model, tok, MSGS, group_size=8, temperature=1.0, max_new_tokens=5,
                      generator=torch.Generator().manual_seed(1))
    finally:
        handle.remove()
    check_rollouts(ro, tok, 5)
    assert ro.hit_cap.any() and (~ro.hit_cap).any()
    assert (ro.completion_lengths[~ro.hit_cap] < 5).any()         # some stopped early


def test_greedy_eos_first_token_and_no_eos(model, tok, check_rollouts):
    handle = _eos_bias(model, tok, 100.0)
    try:
        ro = generate(model, tok, MSGS, group_size=2, temperature=0.0, max_new_tokens=6)
    finally:
        handle.remove()
    assert torch.equal(ro.completion_lengths, torch.ones(4, dtype=torch.long))
    assert not ro.hit_cap.any() and ro.texts == [["", ""], ["", ""]]
    handle = _eos_bias(model, tok, -100.0)
    try:
        ro = generate(model, tok, MSGS, group_size=2, temperature=0.0, max_new_tokens=6)
    finally:
        handle.remove()
    check_rollouts(ro, tok, 6)
    assert ro.hit_cap.all() and (ro.completion_lengths == 6).all()
    assert ro.texts[0][0] == ro.texts[0][1]                        # greedy: identical


def test_randomness_only_from_the_generator(model, tok):
    def run(seed: int, global_seed: int) -> RolloutBatch:
        torch.manual_seed(global_seed)
        return generate(model, tok, MSGS, group_size=4, temperature=1.0, max_new_tokens=6,
                        generator=torch.Generator().manual_seed(seed))
    a, b, c = run(3, 0), run(3, 123), run(4, 0)
    assert a.texts == b.texts and torch.equal(a.input_ids, b.input_ids)
    assert a.texts != c.texts
    state = torch.random.get_rng_state()
    generate(model, tok, MSGS, group_size=2, temperature=1.0, max_new_tokens=4)  # OS entropy
    assert torch.equal(state, torch.random.get_rng_state())      # global RNG untouched
    assert len({t for g in a.texts for t in g}) > 1              # samples differ in a group


def test_batch_size_chunks(model, tok, check_rollouts):
    ro = generate(model, tok, MSGS, group_size=3, temperature=1.0, max_new_tokens=5,
                  generator=torch.Generator().manual_seed(0), batch_size=3)
    check_rollouts(ro, tok, 5)
    assert ro.num_rows == 6


def test_empty_round(model, tok):
    ro = generate(model, tok, [], group_size=4, temperature=0.7, max_new_tokens=8)
    assert ro.num_prompts == 0 and ro.texts == [] and ro.group_size == 4
    assert ro.input_ids.shape == (0, 0) and ro.input_ids.dtype == torch.long
    assert ro.completion_mask.dim() == 2 and ro.attention_mask.dim() == 2
    assert ro.completion_lengths.shape == (0,) and ro.hit_cap.dtype == torch.bool


def test_generation_restores_training_mode(model, tok):
    model.train()
    generate(model, tok, MSGS[:1], group_size=1, temperature=0.0, max_new_tokens=2)
    assert model.training
    model.eval()


@pytest.mark.parametrize("kwargs", [dict(group_size=0), dict(temperature=-1.0),
                                    dict(max_new_tokens=0), dict(batch_size=0)])
def test_invalid_settings(model, tok, kwargs):
    args = dict(group_size=2, temperature=1.0, max_new_tokens=4) | kwargs
    with pytest.raises(ConfigError):
        generate(model, tok, MSGS, **args)


def _rows_of(ro: RolloutBatch, i: int) -> list[list[int]]:
    g = ro.group_size
    return [ids[m.bool()].tolist() for ids, m in
            zip(ro.input_ids[i * g:(i + 1) * g], ro.attention_mask[i * g:(i + 1) * g])]


def test_isolated_rollouts_ignore_batchmates(model, tok):
    """Same per-prompt seeds, a much longer prompt added in between: in isolated mode every
    other prompt's completions are token-identical (record isolation, A2)."""
    longer = " ".join(MSGS) * 8
    kw = dict(group_size=3, temperature=1.0, max_new_tokens=6, isolated=True)
    alone = generate(model, tok, MSGS, seeds=[11, 22], **kw)
    crowded = generate(model, tok, [MSGS[0], longer, MSGS[1]], seeds=[11, 33, 22], **kw)
    assert crowded.input_ids.shape[1] > alone.input_ids.shape[1]
    assert _rows_of(alone, 0) == _rows_of(crowded, 0)
    assert _rows_of(alone, 1) == _rows_of(crowded, 2)
    again = generate(model, tok, MSGS, seeds=[11, 23], **kw)     # the seed is what varies
    assert _rows_of(again, 0) == _rows_of(alone, 0) and _rows_of(again, 1) != _rows_of(alone, 1)
    with pytest.raises(ConfigError, match="one seed per prompt"):
        generate(model, tok, MSGS, seeds=[1], **kw)


def test_top_p_and_repetition_penalty_change_the_sampler(model, tok):
    """The DIBA audit's sampler (top-p 0.9, repetition penalty 1.05) is not training's."""
    from dpgrpo.audit.scoring import DIBA_SAMPLING

    kw = dict(group_size=4, temperature=1.0, max_new_tokens=8, seeds=[5, 6])
    plain = generate(model, tok, MSGS, **kw)
    again = generate(model, tok, MSGS, top_p=1.0, repetition_penalty=1.0, **kw)
    diba = generate(model, tok, MSGS, top_p=DIBA_SAMPLING.top_p,
                    repetition_penalty=DIBA_SAMPLING.repetition_penalty, **kw)
    assert torch.equal(plain.input_ids, again.input_ids)
    assert not torch.equal(plain.input_ids, diba.input_ids)
    with pytest.raises(ConfigError, match="top_p"):
        generate(model, tok, MSGS, top_p=0.0, **kw)


@pytest.mark.parametrize("vocab", [256, 300, 49152])
def test_inverse_cdf_is_the_exact_categorical_draw(vocab):
    """The two-level draw equals a direct fp64 cumsum search, whether or not the vocabulary is a
    multiple of the block (no padding then), and never returns a zero-probability token."""
    from dpgrpo.rollout.sampling import inverse_cdf

    gen = torch.Generator().manual_seed(vocab)
    probs = torch.rand((64, vocab), generator=gen) ** 4
    probs[:, ::3] = 0.0                                     # tokens with no width
    probs = probs / probs.sum(-1, keepdim=True)
    coins = torch.rand(64, generator=gen, dtype=torch.float64)
    cdf = probs.double().cumsum(-1)
    direct = torch.searchsorted(cdf, (coins * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    drawn = inverse_cdf(probs, coins)
    assert (probs[torch.arange(64), drawn] > 0).all()
    assert torch.equal(drawn, direct)
