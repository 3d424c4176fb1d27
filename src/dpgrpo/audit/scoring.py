"""Model-facing part of the audit: sample responses, score tokens, build features.

For each candidate prompt the DIBA attack (Liu et al., Section 5 "Preparation"; Appendix D)
samples N responses (default 8, temperature 0.5) from the fine-tuned policy and N from the base,
rewards each with the task's public verifier, and scores the fine-tuned samples under both
models. The fine-tuned policy is the released LoRA adapter on the public base; the base is the
same :class:`peft.PeftModel` inside ``model.disable_adapter()``. Sampling goes through
:class:`dpgrpo.rollout.RolloutEngine`, whose only randomness is the ``torch.Generator`` passed in.

By default the attack samples from the full tempered distribution, the same sampler as
training; :data:`DIBA_SAMPLING` (``--diba-sampling``) adds the paper's top-p 0.9 and repetition
penalty 1.05.

The baselines score the task's gold target text appended to the chat-formatted prompt
(:mod:`dpgrpo.audit.baselines`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch

from dpgrpo.audit.baselines import TokenStats, baseline_scores
from dpgrpo.audit.features import SampleScores, diba_features
from dpgrpo.errors import ConfigError
from dpgrpo.rollout.batch import chat_text

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

    from dpgrpo.rollout.batch import RolloutBatch
    from dpgrpo.rollout.engine import RolloutEngine

T = TypeVar("T")


@dataclass(frozen=True)
class SamplingSettings:
    """How responses are drawn for the attack (DIBA Appendix D: N = 8, temperature 0.5)."""

    n_samples: int = 8
    temperature: float = 0.5
    max_new_tokens: int | None = None      # None: the task's default_max_new_tokens
    prompts_per_batch: int = 4             # prompts per generate call (x n_samples rows)
    score_batch_size: int = 8              # rows per scoring forward pass
    top_p: float = 1.0                     # DIBA Appendix D: 0.9 (see :data:`DIBA_SAMPLING`)
    repetition_penalty: float = 1.0        # DIBA Appendix D: 1.05

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise ConfigError(f"n_samples must be >= 1, got {self.n_samples}")
        if self.temperature <= 0.0:
            raise ConfigError("the attack samples: temperature must be > 0, "
                              f"got {self.temperature}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.prompts_per_batch < 1 or self.score_batch_size < 1:
            raise ConfigError("batch sizes must be >= 1")
        if not (0.0 < self.top_p <= 1.0 and self.repetition_penalty > 0.0):
            raise ConfigError("need 0 < top_p <= 1 and repetition_penalty > 0")


#: The attack paper's sampler (Appendix D): 8 samples at temperature 0.5, top-p 0.9 and a
#: repetition penalty of 1.05 (``dpgrpo audit mia --diba-sampling``).
DIBA_SAMPLING = SamplingSettings(top_p=0.9, repetition_penalty=1.05)


def token_stats(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                score_mask: torch.Tensor, *, with_entropy: bool = False,
                batch_size: int = 8) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-token log-probabilities (and predictive entropies) of ``input_ids`` under ``model``.

    Inputs are ``(N, L)``, left-padded; ``score_mask`` marks the tokens to score. Position ids
    follow the attention mask, as in generation, so left padding does not shift positions.
    Returns ``(N, L)`` float64 arrays aligned with ``input_ids`` (entry t scores token t given
    tokens < t; zero where not scored, and the first real token of a row is never scored), the
    entropy array being ``None`` unless asked for.
    """
    from dpgrpo.objectives.logprobs import token_logprobs_and_entropy

    device = next(model.parameters()).device
    n, length = input_ids.shape
    logp = np.zeros((n, length))
    ent = np.zeros((n, length)) if with_entropy else None
    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, batch_size):
            rows = slice(start, start + batch_size)
            # token t is scored only if some real token precedes it
            want = torch.zeros_like(score_mask[rows], dtype=torch.bool)
            want[:, 1:] = score_mask[rows, 1:].bool() & attention_mask[rows, :-1].bool()
            lp, h = token_logprobs_and_entropy(model, input_ids[rows].to(device),
                                               attention_mask[rows].to(device), want.to(device))
            logp[rows] = lp.double().cpu().numpy()
            if ent is not None:
                ent[rows] = h.double().cpu().numpy()
    finally:
        model.train(was_training)
    return logp, ent


def _completion_logprobs(model: torch.nn.Module, batch: RolloutBatch,
                         batch_size: int) -> np.ndarray:
    """``(N, L)`` log-probabilities of a rollout's completion tokens, each prompt run once.

    The quantity of :func:`dpgrpo.objectives.logprobs.token_logprobs` with the completion mask
    (position ids from the attention mask, no full-vocabulary logits), so the audit's k3 and
    likelihood ratio are those of the GRPO objective's KL term (Eq. 3); the G rows of a prompt
    share one pass over the prompt (``group_size``). ``batch_size`` rows (whole groups) per pass.
    """
    from dpgrpo.objectives.logprobs import token_logprobs

    n, length = batch.input_ids.shape
    out = np.zeros((n, length))
    g = batch.group_size
    per_pass = max(1, batch_size // g)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for first in range(0, batch.num_prompts, per_pass):
                rows = slice(first * g, min(first + per_pass, batch.num_prompts) * g)
                used = batch.attention_mask[rows].bool().any(0).nonzero()
                end = int(used[-1]) + 1 if len(used) else 0                   # trim padding
                lp = token_logprobs(model, batch.input_ids[rows, :end].to(device),
                                    batch.attention_mask[rows, :end].to(device),
                                    mask=batch.completion_mask[rows, :end].to(device),
                                    group_size=g)
                out[rows, :end] = lp.double().cpu().numpy()
    finally:
        model.train(was_training)
    return out


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def base_seed(seed: int) -> int:
    """The seed of the base model's samples: a stream of its own, so they do not depend on
    the fine-tuned model (whose samples draw from ``seed``) and two audits of releases of one
    base, on the same candidates and settings, can share them (:class:`BaseSamples`)."""
    digest = hashlib.sha256(f"dpgrpo/diba-base/{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def base_rewards(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Any,
                 problems: Sequence[object], *,
                 settings: SamplingSettings = SamplingSettings(),
                 generator: torch.Generator | None = None,
                 engine: Any = None) -> list[list[float]]:
    """The verifier's reward of each of ``settings.n_samples`` responses of the base model
    (``model`` with its adapter disabled, or a plain causal LM) to each problem: DIBA's
    base-side input, in the chunks of ``settings.prompts_per_batch`` prompts that
    :func:`diba_feature_rows` uses."""
    from dpgrpo.rollout.transformers_engine import TransformersEngine

    engine = engine or TransformersEngine(model, tokenizer)
    use = {"use_adapter": False} if hasattr(model, "disable_adapter") else {}
    cap = settings.max_new_tokens or int(task.default_max_new_tokens)
    out: list[list[float]] = []
    for chunk in _chunks(list(problems), settings.prompts_per_batch):
        base = engine.generate([task.prompt(p) for p in chunk], group_size=settings.n_samples,
                               temperature=settings.temperature, max_new_tokens=cap,
                               generator=generator, top_p=settings.top_p,
                               repetition_penalty=settings.repetition_penalty, **use)
        out += [[float(task.reward(t, p)) for t in texts] for p, texts in zip(chunk, base.texts)]
    return out


def diba_feature_rows(model: PeftModel, tokenizer: PreTrainedTokenizerBase, task: Any,
                      problems: Sequence[object], *,
                      settings: SamplingSettings = SamplingSettings(),
                      generator: torch.Generator | None = None,
                      base_generator: torch.Generator | None = None,
                      base: Sequence[Sequence[float]] | None = None,
                      engine: RolloutEngine | None = None) -> list[dict[str, float]]:
    """The DIBA features of each problem (:func:`dpgrpo.audit.features.diba_features`).

    ``model`` is the fine-tuned :class:`peft.PeftModel`; the base is ``model.disable_adapter()``.
    ``task`` supplies ``prompt``, ``reward`` and ``default_max_new_tokens``. The fine-tuned
    samples draw from ``generator``, the base's from ``base_generator`` (default: seeded with
    :func:`base_seed` of ``generator``'s seed); ``base``: the base
    samples' rewards, one list per problem, already drawn (:func:`base_rewards`), so the base
    does not sample again. ``engine`` samples (default: the transformers engine over ``model``,
    which records the fine-tuned log-probs of what it samples as it decodes, so only the base
    has to score them; an engine that does not record them has its samples scored under both).
    """
    from dpgrpo.rollout.transformers_engine import TransformersEngine

    if base is None and base_generator is None and generator is not None:
        base_generator = torch.Generator().manual_seed(base_seed(generator.initial_seed()))
    if base is None:      # the base's samples need no recorded log-probs: a plain engine
        base = base_rewards(model, tokenizer, task, problems, settings=settings,
                            generator=base_generator, engine=engine)
    engine = engine or TransformersEngine(model, tokenizer, record_logprobs=True)
    if len(base) != len(problems) or any(len(r) != settings.n_samples for r in base):
        raise ConfigError(f"base samples: need {settings.n_samples} rewards for each of "
                          f"{len(problems)} problems")
    n = settings.n_samples
    cap = settings.max_new_tokens or int(task.default_max_new_tokens)
    rows: list[dict[str, float]] = []
    for first, chunk in zip(range(0, len(problems), settings.prompts_per_batch),
                            _chunks(list(problems), settings.prompts_per_batch)):
        ft = engine.generate([task.prompt(p) for p in chunk], group_size=n,
                             temperature=settings.temperature, max_new_tokens=cap,
                             generator=generator, top_p=settings.top_p,
                             repetition_penalty=settings.repetition_penalty)
        lp_ft = ft.logprobs.numpy() if ft.logprobs is not None else \
            _completion_logprobs(model, ft, settings.score_batch_size)       # recorded, or scored
        with model.disable_adapter():
            lp_base = _completion_logprobs(model, ft, settings.score_batch_size)
        mask = ft.completion_mask.bool().numpy()
        mask[:, 0] = False                                                   # never scored
        for i, problem in enumerate(chunk):
            sl = slice(i * n, (i + 1) * n)
            ft_rewards = [task.reward(t, problem) for t in ft.texts[i]]
            samples = SampleScores(lp_ft[sl], lp_base[sl], mask[sl], tuple(ft.texts[i]))
            rows.append(diba_features(ft_rewards, list(base[first + i]), samples))
    return rows


def _gold_batch(tokenizer: PreTrainedTokenizerBase, task: Any, problems: Sequence[object]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Left-padded ``[prompt][gold target]`` rows and the mask of the target tokens."""
    seqs, masks, texts = [], [], []
    for p in problems:
        prompt = chat_text(tokenizer, task.prompt(p))
        target = task.gold_target(p)
        a = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        b = tokenizer(target, add_special_tokens=False)["input_ids"]
        seqs.append(a + b)
        masks.append([0] * len(a) + [1] * len(b))
        texts.append(target)
    width = max(len(s) for s in seqs)
    pad = int(tokenizer.pad_token_id)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    score = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, width - len(s):] = torch.tensor(s)
        attn[i, width - len(s):] = 1
        score[i, width - len(s):] = torch.tensor(m)
    return ids, attn, score, texts


def gold_baseline_scores(model: PeftModel, tokenizer: PreTrainedTokenizerBase, task: object,
                         problems: Sequence[object], *,
                         batch_size: int = 8, k: float = 0.2) -> dict[str, np.ndarray]:
    """LOSS, zlib, Min-K% and entropy on each problem's gold target, raw and calibrated.

    Scored under the fine-tuned model and, for calibration, under the base
    (``model.disable_adapter()``); see :mod:`dpgrpo.audit.baselines`.
    """
    parts: list[dict[str, np.ndarray]] = []
    for chunk in _chunks(list(problems), batch_size):
        ids, attn, score, texts = _gold_batch(tokenizer, task, chunk)
        lp_ft, h_ft = token_stats(model, ids, attn, score, with_entropy=True,
                                  batch_size=batch_size)
        with model.disable_adapter():
            lp_b, h_b = token_stats(model, ids, attn, score, with_entropy=True,
                                    batch_size=batch_size)
        mask = score.bool().numpy()
        mask[:, 0] = False
        # with_entropy=True: the entropies are arrays, never None
        ft = TokenStats(lp_ft, cast(np.ndarray, h_ft), mask)
        base = TokenStats(lp_b, cast(np.ndarray, h_b), mask)
        parts.append(baseline_scores(ft, base, texts, k=k))
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]} if parts else {}
