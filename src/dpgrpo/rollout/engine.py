"""The rollout-engine interface shared by training, evaluation and the audit's sampling.

An engine turns user messages into G completions each, with the policy's *current* weights,
and returns a :class:`~dpgrpo.rollout.batch.RolloutBatch` (rows prompt-major, masks), so the
objectives and per-prompt gradients never see which engine ran::

    engine = make_engine("transformers", policy.model, tokenizer, isolated=True)
    batch = engine.generate(messages, group_size=8, temperature=0.7, max_new_tokens=1024,
                            seeds=seeds)                     # one seed per prompt
    base = engine.generate(messages, ..., use_adapter=False)  # the reference policy

Engines: ``transformers`` (:mod:`dpgrpo.rollout.transformers_engine`, CPU or GPU, always
available) and ``vllm`` (:mod:`dpgrpo.rollout.vllm_engine`, GPU, ``pip install
dpgrpo[vllm]``). ``train.rollout_engine`` picks one for training.

Record isolation (assumption A2, ``train.rollout_isolation``): with ``isolated=True`` an engine
must generate each prompt's completions in calls that hold that prompt alone, so they do not
depend on which prompts share the round; ``isolated=False`` may batch prompts together.
Each engine states what it guarantees in :attr:`RolloutEngine.isolation`, which the
certificate's ``record_isolation`` quotes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from dpgrpo.config.schema import Engine
from dpgrpo.config.values import choices
from dpgrpo.errors import ConfigError
from dpgrpo.rollout.batch import Message, RolloutBatch

#: engine names accepted by ``train.rollout_engine`` and :func:`make_engine`
ENGINES: tuple[str, ...] = choices(Engine)   # train.rollout_engine's one list


@runtime_checkable
class RolloutEngine(Protocol):
    """G completions per user message with the current adapter weights."""

    name: str
    isolated: bool

    @property
    def isolation(self) -> str:
        """What this engine guarantees about batch-mates (quoted in the certificate)."""
        ...

    def generate(self, user_messages: Sequence[Message], *, group_size: int, temperature: float,
                 max_new_tokens: int, seeds: Sequence[int] | None = None,
                 generator: torch.Generator | None = None, use_adapter: bool = True,
                 top_p: float = 1.0, repetition_penalty: float = 1.0) -> RolloutBatch:
        """Sample ``group_size`` completions per message or conversation (chat template
        applied by :func:`~dpgrpo.rollout.batch.chat_text`).

        ``temperature`` 0 is greedy. ``seeds`` (one per prompt) fix each prompt's coins;
        default: drawn from ``generator`` (itself seeded from OS entropy when ``None``).
        ``use_adapter=False`` samples from the base policy (LoRA off). ``top_p`` and
        ``repetition_penalty`` change the sampler (the DIBA audit's option).
        """
        ...


def check_request(group_size: int, max_new_tokens: int, rows_per_call: int | None = None) -> None:
    """Refuse impossible shapes with a one-line reason."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if rows_per_call is not None and rows_per_call < 1:
        raise ConfigError(f"batch_size must be >= 1, got {rows_per_call}")


def prompt_seeds(seeds: Sequence[int] | None, generator: torch.Generator | None,
                 num_prompts: int) -> list[int]:
    """One seed per prompt: the given ones, else drawn from ``generator``, else 256 fresh bits
    of OS entropy per prompt (independent of the other prompts, so nothing depends on order).

    Training never relies on the defaults: the trainer passes each prompt a 256-bit seed bound
    to its (round, slot) (:class:`dpgrpo.privacy.record_coins.PromptCoins`)."""
    if seeds is None:
        if generator is None:
            seeds = [int.from_bytes(os.urandom(32), "little") for _ in range(num_prompts)]
        else:
            seeds = [int(torch.randint(0, 2**62, (1,), generator=generator))
                     for _ in range(num_prompts)]
    if len(seeds) != num_prompts:
        raise ConfigError(f"need one seed per prompt: {len(seeds)} seeds, "
                          f"{num_prompts} prompts")
    return [int(s) for s in seeds]


def request_seed(seed: int, row: int) -> int:
    """A 63-bit seed for row ``row`` of a prompt with (up to 256-bit) ``seed``, for samplers
    that take an integer (vLLM's per-request seed, ``torch.manual_seed``): the ChaCha20
    keystream under the prompt's seed with the row as nonce, so the rows of one prompt never
    share a stream (``seed + row`` would let prompt seeds s and s + 1 overlap) and the prompt's
    256-bit seed stays hidden behind the PRF."""
    from dpgrpo.privacy.record_coins import keystream, seed_key

    nonce = bytes(4) + int(row).to_bytes(12, "little")
    return int.from_bytes(keystream(seed_key(seed), nonce, 8), "little") >> 1


def plan_calls(lengths: Sequence[int], group_size: int, rows_per_call: int | None,
               isolated: bool) -> list[list[int]]:
    """Global row indices (prompt-major) of each call: isolated calls hold one prompt; batched
    calls pack whole groups of prompts sorted by length, at most ``rows_per_call`` rows."""
    n_rows = len(lengths) * group_size
    cap = rows_per_call or n_rows
    groups = [list(range(p * group_size, (p + 1) * group_size)) for p in range(len(lengths))]
    if isolated or cap < group_size:
        order = range(len(lengths)) if isolated else sorted(range(len(lengths)),
                                                            key=lambda p: lengths[p])
        return [groups[p][c:c + cap] for p in order for c in range(0, group_size, cap)]
    per_call = cap // group_size
    order = sorted(range(len(lengths)), key=lambda p: lengths[p])
    return [[r for p in order[s:s + per_call] for r in groups[p]]
            for s in range(0, len(order), per_call)]


__all__ = ["ENGINES", "RolloutEngine", "check_request", "plan_calls", "prompt_seeds",
           "request_seed"]
