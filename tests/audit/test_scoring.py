"""Model-facing scoring on the tiny model: token log-probabilities and DIBA features."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from audit_toy import register_toy_task, toy_problems
from dpgrpo.audit.scoring import (
    SamplingSettings,
    diba_feature_rows,
    gold_baseline_scores,
    token_stats,
)
from dpgrpo.model import LoraSettings, load_adapter, load_policy
from dpgrpo.rollout.transformers_engine import TransformersEngine
from dpgrpo.tasks import get_task

SETTINGS = SamplingSettings(n_samples=2, max_new_tokens=6)


@pytest.fixture(scope="module")
def toy_task():
    return get_task(register_toy_task())


@pytest.fixture(scope="module")
def zero_policy(tiny_model_dir):
    """A fresh adapter (B = 0): fine-tuned and base are the same function."""
    return load_policy(str(tiny_model_dir), lora=LoraSettings(dropout=0.0))


@pytest.fixture(scope="module")
def toy_policy(tiny_model_dir, tmp_path_factory):
    from audit_toy import make_toy_run

    run = make_toy_run(tmp_path_factory.mktemp("run"), tiny_model_dir)
    return load_adapter(str(tiny_model_dir), run / "release")


def test_token_stats_ignore_left_padding(toy_policy):
    model, tok = toy_policy.model, toy_policy.tokenizer
    short = tok("What is 1 plus 4?")["input_ids"]
    long = tok("What is 12 plus 30? It is")["input_ids"]
    width = len(long)
    ids = torch.full((2, width), tok.pad_token_id)
    attn = torch.zeros((2, width), dtype=torch.long)
    ids[0, width - len(short):], attn[0, width - len(short):] = torch.tensor(short), 1
    ids[1], attn[1] = torch.tensor(long), 1
    score = attn.clone()
    lp, ent = token_stats(model, ids, attn, score, with_entropy=True)
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=torch.tensor([short])).logits[0, :-1].double(), -1)
    expected = ref.gather(-1, torch.tensor(short[1:]).unsqueeze(-1)).squeeze(-1).numpy()
    np.testing.assert_allclose(lp[0, width - len(short) + 1:], expected, atol=1e-5)
    assert lp[0, : width - len(short) + 1].tolist() == [0.0] * (width - len(short) + 1)
    scored = (score[:, 1:].bool() & attn[:, :-1].bool()).numpy()
    assert (ent[:, 1:][scored] > 0).all() and (ent[:, 1:][~scored] == 0).all()
    assert (lp[:, 1:][scored] < 0).all() and scored.sum() == len(short) - 1 + len(long) - 1
    from dpgrpo.objectives.grpo import token_logprobs  # the training's log-probabilities

    with torch.no_grad():
        train_lp = token_logprobs(model, ids, attn).double().numpy()
    np.testing.assert_allclose(lp[:, 1:][scored], train_lp[:, 1:][scored], atol=1e-5)


def test_zero_adapter_gives_zero_logit_features(zero_policy, toy_task):
    problems = toy_problems("p", 3)
    rows = diba_feature_rows(zero_policy.model, zero_policy.tokenizer, toy_task, problems,
                             settings=SETTINGS, generator=torch.Generator().manual_seed(0))
    # the fine-tuned log-probs are recorded while decoding, the base's scored in one pass:
    # the same numbers up to fp32 summation order
    for r in rows:
        assert abs(r["likelihood_ratio"]) < 1e-5 and abs(r["k3_divergence"]) < 1e-10
        assert abs(r["zlib_likelihood_ratio"]) < 1e-5
    scored = diba_feature_rows(zero_policy.model, zero_policy.tokenizer, toy_task, problems,
                               settings=SETTINGS, generator=torch.Generator().manual_seed(0),
                               engine=TransformersEngine(zero_policy.model, zero_policy.tokenizer))
    for r in scored:                               # both scored by the same pass: exactly zero
        assert r["likelihood_ratio"] == 0.0 and r["k3_divergence"] == 0.0
        assert r["zlib_likelihood_ratio"] == 0.0
    gold = gold_baseline_scores(zero_policy.model, zero_policy.tokenizer, toy_task, problems)
    for name in ("loss", "zlib", "min_k", "entropy"):
        assert np.abs(gold[f"{name}_calibrated"]).max() == 0.0
        assert np.isfinite(gold[name]).all()
    assert (gold["loss"] < 0).all() and (gold["entropy"] < 0).all()


def test_features_on_a_random_adapter(toy_policy, toy_task):
    problems = toy_problems("p", 5)

    def run(seed):
        return diba_feature_rows(toy_policy.model, toy_policy.tokenizer, toy_task, problems,
                                 settings=SETTINGS, generator=torch.Generator().manual_seed(seed))

    rows = run(1)
    assert rows == run(1)                                        # seeded sampler
    assert len(rows) == 5
    for r in rows:
        assert r["ft_score"] in (0.0, 0.5, 1.0) and r["base_score"] in (0.0, 0.5, 1.0)
        assert r["score_gain"] == r["ft_score"] - r["base_score"]
        assert r["k3_divergence"] > 0.0                          # the adapter moved the policy
        assert r["likelihood_ratio"] != 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_completion_logprobs_share_each_prompt_and_equal_the_training_path(toy_policy, toy_task,
                                                                         dtype):
    """The audit scores a prompt's G completions on one pass over the prompt: the values are
    the training objective's token log-probabilities (fine-tuned and base), prompts of several
    lengths, completions that stop early, groups split across passes."""
    from dpgrpo.audit.scoring import _completion_logprobs
    from dpgrpo.objectives.logprobs import token_logprobs
    from dpgrpo.rollout import make_engine

    model, tok = toy_policy.model, toy_policy.tokenizer
    model.to(dtype)
    try:
        problems = toy_problems("q", 5)
        messages = [toy_task.prompt(p) + " x" * i for i, p in enumerate(problems)]   # lengths vary
        batch = make_engine("transformers", model, tok).generate(
            messages, group_size=3, temperature=1.0, max_new_tokens=7,
            generator=torch.Generator().manual_seed(3))
        # a random model seldom stops: end row r after 1 + r % 7 tokens, as an EOS would
        start = int(batch.completion_mask.bool().any(0).long().argmax())
        ids, attn, comp = (t.clone() for t in (batch.input_ids, batch.attention_mask,
                                               batch.completion_mask))
        for r in range(ids.shape[0]):
            cut = start + 1 + r % 7
            ids[r, cut:], attn[r, cut:], comp[r, cut:] = tok.pad_token_id, 0, 0
        batch = dataclasses.replace(batch, input_ids=ids, attention_mask=attn,
                                    completion_mask=comp)
        assert attn[:, 0].min() == 0 and comp.sum(1).min() == 1 and comp.sum(1).max() == 7
        for disable in (False, True):
            with model.disable_adapter() if disable else torch.no_grad():
                with torch.no_grad():
                    ref = token_logprobs(model, batch.input_ids, batch.attention_mask,
                                         mask=batch.completion_mask).double().numpy()
                for rows in (3, 7, 64):                   # 1 group, 2 groups, all per pass
                    got = _completion_logprobs(model, batch, rows)
                    tol = 1e-5 if dtype == torch.float32 else 1e-10
                    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
                    scored = batch.completion_mask.bool().numpy()
                    assert (got[~scored] == 0).all() and (got[scored] < 0).all()
    finally:
        model.to(torch.float32)


def test_recorded_logprobs_are_the_scored_ones(toy_policy, toy_task):
    """The engine records the log-probs of what it samples (temperature 1, whatever the sampling
    temperature, top-p or penalty); they equal scoring the samples afterwards, so DIBA's features
    do not change when the fine-tuned samples are not scored again."""
    from dpgrpo.objectives.logprobs import token_logprobs

    model, tok = toy_policy.model, toy_policy.tokenizer
    problems = toy_problems("r", 4)
    messages = [toy_task.prompt(p) + " y" * i for i, p in enumerate(problems)]
    model.to(torch.float64)
    try:
        for merge in (True, False):
            engine = TransformersEngine(model, tok, record_logprobs=True, merge_adapter=merge)
            batch = engine.generate(messages, group_size=3, temperature=0.5, max_new_tokens=6,
                                    generator=torch.Generator().manual_seed(5), top_p=0.9,
                                    repetition_penalty=1.05)
            with torch.no_grad():
                ref = token_logprobs(model, batch.input_ids, batch.attention_mask,
                                     mask=batch.completion_mask).numpy()
            np.testing.assert_allclose(batch.logprobs.numpy(), ref, atol=1e-10, rtol=0)
            assert (batch.logprobs[batch.completion_mask == 0] == 0).all()
        plain = TransformersEngine(model, tok).generate(messages, group_size=3, temperature=0.5,
                                                        max_new_tokens=6,
                                                        generator=torch.Generator().manual_seed(5))
        assert plain.logprobs is None
    finally:
        model.to(torch.float32)
    settings = SamplingSettings(n_samples=3, max_new_tokens=6)
    recorded = diba_feature_rows(model, tok, toy_task, problems, settings=settings,
                                 generator=torch.Generator().manual_seed(1))
    scored = diba_feature_rows(model, tok, toy_task, problems, settings=settings,
                               generator=torch.Generator().manual_seed(1),
                               engine=TransformersEngine(model, tok))
    for a, b in zip(recorded, scored):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], atol=1e-4)
