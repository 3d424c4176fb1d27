"""The transformers rollout engine: bounded row batches over :func:`dpgrpo.rollout.decode.decode`.

Prompts are tokenized once. Rows are planned into calls of at most ``rows_per_call`` rows:

* ``isolated``: each call holds rows of ONE prompt (its group split if G > rows_per_call),
  unpadded, so a prompt's completions never depend on which prompts share the round;
* batched: whole groups are packed into calls after sorting the prompts by length, so a call
  pads little; rows of different prompts then share forward passes (the A2 gap in floating
  point; every prompt still has its own coins, see :mod:`dpgrpo.rollout.sampling`).

Randomness comes only from the per-prompt seeds (drawn from the ``torch.Generator`` given, or
OS entropy): the global torch RNG is neither read nor advanced.

``sample_dropout`` (``train.rollout_dropout``): sample as TRL's GRPOTrainer does, with the
adapter unmerged and its LoRA dropout firing on every decoded token (the rest of the model stays
in eval mode). The masks of a call come from torch's generator reseeded, inside
``torch.random.fork_rng``, from a PRF of the seeds of the prompts in that call (a stream apart
from their sampling coins, :func:`dropout_seed`): in isolated mode a call holds one prompt, so
its masks are bound to that prompt alone; batched calls share one stream among their prompts
(allowed for the non-private arms only, ``config.schema``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from dpgrpo.errors import ConfigError
from dpgrpo.rollout.batch import (
    Message,
    RolloutBatch,
    assemble,
    chat_prompt_ids,
    empty_batch,
    left_pad,
    stop_ids,
)
from dpgrpo.rollout.decode import decode
from dpgrpo.rollout.engine import check_request, plan_calls, prompt_seeds
from dpgrpo.rollout.sampling import SamplerSettings, row_coins

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ISOLATED = ("isolated: each prompt's completions were generated in calls holding that prompt "
            "alone (prefilled once, unpadded), with its own coins, so they do not depend on "
            "which prompts shared the round")
BATCHED = ("batched: completions of several prompts (sorted by length) shared padded forward "
           "passes; each prompt's sampling coins are its own, so in exact arithmetic its "
           "completions do not depend on its batch-mates, but floating-point kernels are not "
           "batch-invariant, so they can differ in the last bits (the paper's A2 gap, not "
           "quantified; set train.rollout_isolation = 'isolated' to remove it)")


def isolation_text(isolated: bool) -> str:
    """The certificate's statement for this engine (see :data:`ISOLATED`, :data:`BATCHED`)."""
    return ISOLATED if isolated else BATCHED


#: the ChaCha20 nonce of a prompt's rollout-dropout stream (its sampling coins use the zero one)
DROPOUT_NONCE = bytes(4) + b"rolldrop" + bytes(4)


def dropout_seed(seeds: Sequence[int], part: int = 0) -> int:
    """A 64-bit torch seed for the LoRA-dropout masks of a call over prompts with ``seeds``: a
    PRF output of the first prompt's 256-bit seed under :data:`DROPOUT_NONCE` (its last four
    bytes: ``part``, the call's first row within the prompt when a group is split over calls),
    the others' seeds mixed in with SHA-256 when the call holds several prompts (batched)."""
    import hashlib

    from dpgrpo.privacy.record_coins import keystream, seed_key

    seed = int(seeds[0])
    if len(seeds) > 1:
        digest = hashlib.sha256(b"".join(seed_key(int(s)) for s in seeds)).digest()
        seed = int.from_bytes(digest, "little")
    nonce = DROPOUT_NONCE[:12] + int(part).to_bytes(4, "little")
    return int.from_bytes(keystream(seed_key(seed), nonce, 8), "little")


def _lora_dropouts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The adapter's dropout modules with p > 0 (peft's ``lora_dropout`` entries)."""
    return [m for name, m in model.named_modules()
            if ".lora_dropout." in f".{name}." and isinstance(m, torch.nn.Dropout) and m.p > 0]


@contextlib.contextmanager
def _policy_mode(model: Any, use_adapter: bool, dropout: bool = False) -> Iterator[None]:
    """Eval mode (no LoRA dropout; with ``dropout``, the LoRA dropout modules alone in train
    mode), inference mode, and the adapter on or off."""
    if not use_adapter and not hasattr(model, "disable_adapter"):
        raise ConfigError("use_adapter=False needs a model with a LoRA adapter (PeftModel)")
    was_training = model.training
    model.eval()
    if dropout and use_adapter:
        for module in _lora_dropouts(model):
            module.train()
    try:
        with (model.disable_adapter() if not use_adapter else contextlib.nullcontext()), \
                torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _lora_layers(model: Any) -> list[Any]:
    """The model's active, enabled LoRA layers that can be merged (peft's ``LoraLayer``)."""
    return [m for m in model.modules()
            if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")
            and getattr(m, "_disable_adapters", True) is False and not getattr(m, "merged", True)
            and len(getattr(m, "active_adapters", ())) == 1]


@contextlib.contextmanager
def merged_adapter(model: object) -> Iterator[None]:
    """Decode with ``W + scale B A`` as each adapted layer's weight, the LoRA path switched off.

    One product per layer instead of three: on the CPU the 2 x 7 x L small LoRA products of a
    decoding step cost ~7% of it (SmolLM2, 48 rows). The merged weights are new tensors: the
    base weights are never written, so leaving restores them exactly (the frozen reference
    stays bit-identical), and the adapter's parameters and their ``requires_grad`` are left
    alone. Outputs differ from the unmerged path by rounding only. Costs one merged copy of the
    adapted weights while it lasts.
    """
    layers = _lora_layers(model)
    saved = []
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.base_layer
                weight = base.weight
                adapter = layer.active_adapters[0]
                delta = layer.get_delta_weight(adapter).to(weight.dtype)
                saved.append((layer, weight, base.bias))
                base.weight = torch.nn.Parameter(weight + delta, requires_grad=False)
                lora_bias = layer.lora_B[adapter].bias  # model.lora_bias: scale * b on the output
                if lora_bias is not None:
                    shift = (lora_bias * layer.scaling[adapter]).to(weight.dtype)
                    bias = shift if base.bias is None else base.bias + shift
                    base.bias = torch.nn.Parameter(bias, requires_grad=False)
                layer._disable_adapters = True
        yield
    finally:
        for layer, weight, bias in saved:
            layer.base_layer.weight = weight
            layer.base_layer.bias = bias
            layer._disable_adapters = False


class TransformersEngine:
    """Rollouts with the model object itself: its current weights, on its device."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *,
                 isolated: bool = False,
                 rows_per_call: int | None = None, cuda_graphs: bool = True,
                 merge_adapter: bool | None = None, record_logprobs: bool = False,
                 sample_dropout: bool = False) -> None:
        check_request(1, 1, rows_per_call)
        self.model, self.tokenizer = model, tokenizer
        self.isolated, self.rows_per_call = isolated, rows_per_call
        self.cuda_graphs = cuda_graphs       # constant-shape steps replayed as a graph (CUDA)
        self.merge_adapter = merge_adapter   # None: on the CPU only (see merged_adapter)
        self.record_logprobs = record_logprobs   # RolloutBatch.logprobs (the audit's scores)
        self.sample_dropout = sample_dropout     # LoRA dropout on while sampling (TRL's law)

    @property
    def isolation(self) -> str:
        return isolation_text(self.isolated)

    def generate(self, user_messages: Sequence[Message], *, group_size: int, temperature: float,
                 max_new_tokens: int, seeds: Sequence[int] | None = None,
                 generator: torch.Generator | None = None, use_adapter: bool = True,
                 top_p: float = 1.0, repetition_penalty: float = 1.0) -> RolloutBatch:
        """See :meth:`dpgrpo.rollout.engine.RolloutEngine.generate`."""
        check_request(group_size, max_new_tokens)
        sampler = SamplerSettings(temperature, top_p, repetition_penalty)
        if not user_messages:
            return empty_batch(group_size)
        seeds = prompt_seeds(seeds, generator, len(user_messages))
        prompts = chat_prompt_ids(self.tokenizer, user_messages)
        coins = None if sampler.greedy else row_coins(seeds, group_size, max_new_tokens)
        stop, pad_id = stop_ids(self.model, self.tokenizer), int(self.tokenizer.pad_token_id)
        n_rows = len(prompts) * group_size
        generated = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long)  # (N, T)
        logp = torch.zeros((n_rows, max_new_tokens), dtype=torch.float64) \
            if self.record_logprobs else None
        calls = plan_calls([len(p) for p in prompts], group_size, self.rows_per_call,
                           self.isolated)
        device = next(self.model.parameters()).device
        dropout = self.sample_dropout and use_adapter
        merge = not dropout and (self.merge_adapter if self.merge_adapter is not None
                                 else device.type == "cpu")
        with (merged_adapter(self.model) if merge and use_adapter else contextlib.nullcontext()), \
                _policy_mode(self.model, use_adapter, dropout):
            for rows in calls:
                owners = sorted({r // group_size for r in rows})
                local = {p: i for i, p in enumerate(owners)}
                part = rows[0] % group_size if len(owners) == 1 else 0   # a split group
                with _call_masks(dropout, [seeds[p] for p in owners], part, device):
                    out = self._decode(prompts, owners, local, rows, coins, sampler, group_size,
                                       max_new_tokens, stop, pad_id, device, dropout)
                if logp is not None:
                    out, logp[rows] = out[0], out[1].double().cpu()
                generated[rows] = cast(torch.Tensor, out).cpu()   # a tuple only with logp
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        return assemble(self.tokenizer, prompt_ids.repeat_interleave(group_size, 0),
                        prompt_mask.repeat_interleave(group_size, 0), generated, stop, pad_id,
                        group_size, len(prompts), max_new_tokens, logp)

    def _decode(self, prompts: list[list[int]], owners: list[int], local: dict[int, int],
                rows: list[int], coins: torch.Tensor | None, sampler: SamplerSettings,
                group_size: int, max_new_tokens: int, stop: list[int], pad_id: int,
                device: torch.device, dropout: bool
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One call's rows (:func:`decode`); no CUDA graph while dropout draws masks."""
        return decode(
            self.model, [prompts[p] for p in owners], [local[r // group_size] for r in rows],
            None if coins is None else coins[rows], sampler=sampler,
            max_new_tokens=max_new_tokens, stop=stop, pad_id=pad_id,
            static=self.cuda_graphs and device.type == "cuda" and not dropout,
            logprobs=self.record_logprobs)


@contextlib.contextmanager
def _call_masks(dropout: bool, seeds: list[int], part: int,
                device: torch.device) -> Iterator[None]:
    """With ``dropout``: torch's generators forked and reseeded from :func:`dropout_seed` of
    the call's prompts, so the run's global state is untouched and the masks are theirs."""
    if not dropout:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        seed = dropout_seed(seeds, part)
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        yield


__all__ = ["BATCHED", "DROPOUT_NONCE", "ISOLATED", "TransformersEngine", "dropout_seed",
           "isolation_text", "merged_adapter"]
