"""Per-prompt gradients of the trainable (LoRA) parameters: the records DP-SGD clips.

The record is a prompt with all of its rows (Section III-D), so each gradient returned here is
the gradient of one prompt's loss ``sum_r row_weights[i, r] * row_loss[i, r]`` (Eq. 7), never
a per-completion gradient. Results map each trainable parameter name to a tensor of shape
``(B, *param.shape)`` in fp32 (fp64 for fp64 parameters); ``privacy.mechanism`` is the only
place where prompts are combined. Parameters' ``.grad`` fields are never touched.

Every forward/backward pass holds rows of ONE prompt only, at most ``rows_per_pass`` of them
(a public setting), on those rows' own columns (:meth:`TrainBatch.window`). A prompt's gradient
is therefore computed from that prompt's rows alone, with shapes fixed by its own data and the
public configuration: adding or removing a batch-mate, however long, leaves it bit-identical
(assumption A2, checked by ``dpgrpo verify``'s ``batchmate_isolation``). Row chunks are
accumulated before anything else happens ("rollout-chunked backward identity", Appendix B).
Memory is set by ``rows_per_pass``, never by the number of prompts in the round.

LoRA dropout masks are bound to the prompt too (:class:`PromptDropout`): each prompt's passes
draw their masks from torch's generator reseeded at the prompt's first pass with a 64-bit PRF
output of the prompt's own 256-bit dropout seed (the trainer's come from the prompt's round
and slot, :mod:`dpgrpo.privacy.record_coins`), inside ``torch.random.fork_rng`` so the run's
global generator is neither read nor advanced. A prompt's masks are therefore the same
whatever its batch-mates and its position (without that, one record's presence shifted every
later record's masks). Reseeding the global generator rather than passing a private one keeps
gradient checkpointing exact: its recomputation replays the global state it stashed.

Two implementations that agree up to floating-point summation order:

* :func:`per_prompt_grads_reference`: ``torch.autograd.grad`` with respect to the parameters
  (Algorithm 1, line 6).
* :func:`per_prompt_grads_fast` (default): hooks on the PEFT LoRA layers form each weight
  gradient ``sum over tokens of grad_out (x) input`` inside the backward, with the LoRA
  parameters frozen during the pass so autograd saves none of their inputs. The hooks keep the
  layer's *original* input (shared by q/k/v, gate/up) and LoRA dropout's boolean mask, and
  rebuild the dropped, upcast input when the gradient arrives: no per-layer fp32 copy of the
  activations lives until backward (a bf16 model would otherwise keep one per adapted layer).
  Its backward starts at the input of the lowest adapted decoder layer
  (:func:`first_adapted_layer`): the frozen layers below record no graph and get no backward.
  The hooks are :mod:`dpgrpo.training.lora_hooks`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch

from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.model_adapters import trainable_parameters  # here too, as before
from dpgrpo.objectives import Objective, TrainBatch
from dpgrpo.objectives.grpo import prompt_row_chunks
from dpgrpo.training.lora_hooks import LoraHooks, first_adapted_layer
from dpgrpo.training.runtime import release_free_memory

PerPromptGrads = dict[str, torch.Tensor]   # name -> (B, *param.shape)


def _acc_dtype(param: torch.Tensor) -> torch.dtype:
    return torch.promote_types(param.dtype, torch.float32)


def _zeros(params: dict[str, torch.nn.Parameter], num_prompts: int) -> PerPromptGrads:
    return {n: torch.zeros((num_prompts, *p.shape), dtype=_acc_dtype(p), device=p.device)
            for n, p in params.items()}


def _weighted_loss(objective: Objective, model: torch.nn.Module, batch: TrainBatch,
                   rows: slice) -> torch.Tensor:
    """sum over ``rows`` (all of one prompt) of row_weight * row_loss: part of Eq. (7)."""
    r = batch.rows_per_prompt
    prompt, first = divmod(rows.start, r)
    weights = batch.row_weights[prompt, first:first + (rows.stop - rows.start)]
    losses = objective.row_losses(model, batch, rows)                     # (n,)
    return (losses * weights.to(losses)).sum()


class PromptDropout:
    """Binds each prompt's dropout masks to that prompt's seed (see the module docstring).

    ``seeds``: one per prompt (integers in [0, 2^256)); ``None``: 256 fresh bits of OS entropy
    per prompt, independent of the others, so nothing depends on order either.
    """

    def __init__(self, seeds: Sequence[int] | None, num_prompts: int,
                 device: torch.device) -> None:
        if seeds is not None and len(seeds) != num_prompts:
            raise PrivacyError(f"{len(seeds)} dropout seeds for {num_prompts} prompts: every "
                               "prompt needs its own")
        self.seeds = list(seeds) if seeds is not None else None
        self.device = device

    @contextlib.contextmanager
    def scope(self) -> Iterator[PromptDropout]:
        """Fork torch's generators (CPU and this device) so the run's state is untouched."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            yield self

    def bind(self, prompt: int) -> None:
        """Start prompt ``prompt``'s masks: reseed torch's generator from its seed alone."""
        from dpgrpo.privacy.record_coins import torch_seed

        seed = torch_seed(self.seeds[prompt] if self.seeds is not None
                          else int.from_bytes(os.urandom(32), "little"))
        torch.default_generator.manual_seed(seed)            # masks of CPU tensors
        if self.device.type == "cuda":                       # and of this device's (Philox)
            index = self.device.index if self.device.index is not None \
                else torch.cuda.current_device()
            torch.cuda.default_generators[index].manual_seed(seed)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def prompt_gradient(model: torch.nn.Module, objective: Objective, batch: TrainBatch,
                    prompt: int, *, rows_per_pass: int | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradient of one prompt (Eq. 7), its rows processed ``rows_per_pass`` at a time.

    Returns the detached scalar loss and name -> (*param.shape) gradients, accumulated over
    all chunks (clipping, if any, comes after this).
    """
    if rows_per_pass is not None and rows_per_pass < 1:
        raise ConfigError(f"rows per pass must be >= 1, got {rows_per_pass}")
    params = trainable_parameters(model)
    r = batch.rows_per_prompt
    grads = {n: torch.zeros(p.shape, dtype=_acc_dtype(p), device=p.device)
             for n, p in params.items()}
    total: torch.Tensor | None = None
    for rows in prompt_row_chunks(r, r, rows_per_pass):
        rows = slice(prompt * r + rows.start, prompt * r + rows.stop)
        loss = _weighted_loss(objective, model, batch, rows)
        total = loss.detach() if total is None else total + loss.detach()
        if not loss.requires_grad:
            continue
        parts = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (name, _), g in zip(params.items(), parts):
            if g is not None:
                grads[name] += g.to(grads[name].dtype)
    assert total is not None
    return total, grads


def per_prompt_grads_reference(model: torch.nn.Module, objective: Objective,
                               batch: TrainBatch, *, rows_per_pass: int | None = None,
                               dropout_seeds: Sequence[int] | None = None) -> PerPromptGrads:
    """One backward per prompt and row chunk (Algorithm 1, line 6): name -> (B, *shape).
    Prompt i's dropout masks come from ``dropout_seeds[i]`` alone (:class:`PromptDropout`)."""
    out = _zeros(trainable_parameters(model), batch.num_prompts)
    if batch.num_prompts == 0:
        return out
    with PromptDropout(dropout_seeds, batch.num_prompts, _device(model)).scope() as masks:
        for i in range(batch.num_prompts):
            masks.bind(i)
            _, grads = prompt_gradient(model, objective, batch, i, rows_per_pass=rows_per_pass)
            for name, g in grads.items():
                out[name][i] = g
            release_free_memory()         # each prompt starts from the same RSS (runtime.py)
    return out


# --- the fast path: LoRA hooks (training/lora_hooks.py) --------------------------------------

def per_prompt_grads_fast(model: torch.nn.Module, objective: Objective, batch: TrainBatch,
                          *, rows_per_pass: int | None = None,
                          dropout_seeds: Sequence[int] | None = None) -> PerPromptGrads:
    """Per-prompt gradients through LoRA hooks: name -> (B, *param.shape).

    One forward/backward per prompt and chunk of at most ``rows_per_pass`` of its rows; prompt
    i's dropout masks come from ``dropout_seeds[i]`` alone (:class:`PromptDropout`).
    Raises ConfigError if a trainable parameter is not a PEFT LoRA weight (no hook could
    split its gradient).
    """
    params = trainable_parameters(model)
    b, r = batch.num_prompts, batch.rows_per_prompt
    out = _zeros(params, b)
    if b == 0 or r == 0:
        return out
    masks = PromptDropout(dropout_seeds, b, _device(model))
    hooks = LoraHooks(model, params, out)
    try:
        with masks.scope():
            for rows in prompt_row_chunks(batch.num_rows, r, rows_per_pass):
                hooks.target = rows.start // r
                if rows.start % r == 0:       # the prompt's first pass: its own masks
                    masks.bind(hooks.target)
                hooks.leaves.clear()
                loss = _weighted_loss(objective, model, batch, rows)
                if loss.requires_grad:
                    torch.autograd.grad(loss, hooks.leaves)
                hooks.leaves.clear()
                if rows.stop % r == 0:
                    release_free_memory()  # each prompt starts from the same RSS (runtime.py)
    finally:
        hooks.remove()
    return out


def per_prompt_grads(model: torch.nn.Module, objective: Objective, batch: TrainBatch, *,
                     method: str = "fast", rows_per_pass: int | None = None,
                     dropout_seeds: Sequence[int] | None = None) -> PerPromptGrads:
    """Dispatch to the ``fast`` path or the ``reference`` loop, ``rows_per_pass`` rows of one
    prompt per pass; ``dropout_seeds``: one per prompt (:class:`PromptDropout`)."""
    rows = rows_per_pass
    if rows is not None and rows < 1:
        raise ConfigError(f"rows per pass must be >= 1, got {rows}")
    if method == "fast":
        return per_prompt_grads_fast(model, objective, batch, rows_per_pass=rows,
                                     dropout_seeds=dropout_seeds)
    if method == "reference":
        return per_prompt_grads_reference(model, objective, batch, rows_per_pass=rows,
                                          dropout_seeds=dropout_seeds)
    raise ConfigError(f"per-prompt gradient method must be 'fast' or 'reference', not {method!r}")


def flat_mean_gradient(model: torch.nn.Module, objective: Objective,
                       batch: TrainBatch) -> dict[str, torch.Tensor]:
    """Non-private reference: gradient of the flat mean of all B*R row losses, one backward."""
    params = trainable_parameters(model)
    grads = {n: torch.zeros(p.shape, dtype=_acc_dtype(p), device=p.device)
             for n, p in params.items()}
    if batch.num_rows == 0:
        return grads
    loss = objective.row_losses(model, batch, slice(0, batch.num_rows)).mean()
    if loss.requires_grad:
        parts = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (name, _), g in zip(params.items(), parts):
            if g is not None:
                grads[name] += g.to(grads[name].dtype)
    return grads


__all__ = ["PerPromptGrads", "PromptDropout", "first_adapted_layer", "flat_mean_gradient",
           "per_prompt_grads", "per_prompt_grads_fast", "per_prompt_grads_reference",
           "prompt_gradient", "trainable_parameters"]
