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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any, Callable, cast

import torch

from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.model_adapters import frozen_adapter_names
from dpgrpo.objectives import Objective, TrainBatch
from dpgrpo.objectives.grpo import prompt_row_chunks
from dpgrpo.training.runtime import release_free_memory

PerPromptGrads = dict[str, torch.Tensor]   # name -> (B, *param.shape)


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Name -> parameter for every parameter that requires grad, less the adapter weights
    ``model.lora_train`` freezes (which PEFT may have switched back on: frozen again here)."""
    frozen = frozen_adapter_names(model)
    return {n: p for n, p in model.named_parameters() if p.requires_grad and n not in frozen}


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


# --- the fast path: LoRA hooks ---------------------------------------------------------------

class _MaskedScale(torch.autograd.Function):
    """x * mask * scale with a boolean mask saved for backward (1 byte per entry); scale 1 is
    one full-width pass instead of two."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        out = torch.where(mask, x, 0)            # as x * mask, one pass without a cast of mask
        return out if scale == 1.0 else out.mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (mask,) = ctx.saved_tensors
        out = torch.where(mask, grad, 0)
        return (out if ctx.scale == 1.0 else out.mul_(ctx.scale)), None, None


class _RecordingDropout(torch.nn.Module):
    """LoRA dropout that tells the hooks its mask instead of leaving a dropped copy behind.

    ``scaled=False`` leaves out the 1/(1-p) factor: the hooks apply it to lora_A's rank-r
    output instead (the same product, one full-width pass fewer each way: see _LoraHooks).
    """

    def __init__(self, p: float, record: Callable[[torch.Tensor | None], None],
                 scaled: bool = True) -> None:
        super().__init__()
        self.p, self.record, self.scaled = p, record, scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            self.record(None)
            return x
        mask = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - self.p)
        self.record(mask)
        return _MaskedScale.apply(x, mask, 1.0 / (1.0 - self.p) if self.scaled else 1.0)


def _is_lora_layer(module: torch.nn.Module) -> bool:
    return (isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict)
            and hasattr(module, "base_layer"))


def first_adapted_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The lowest decoder layer holding a LoRA layer, when every LoRA layer lies in the
    decoder's ``layers`` and no layer recomputes itself (gradient checkpointing); else None.

    The layers below it are frozen and have no adapter, so a pass needs no backward through
    them: the fast path starts its backward at this layer's input instead of the embeddings
    (with LoRA on the last 6 of 30 layers, 24 layers' backward fewer per prompt). The weight
    gradients are the same bits either way: they are formed above this point.
    """
    from dpgrpo.objectives.logprobs import decoder_and_head, uses_checkpointing

    if uses_checkpointing(model):
        return None
    try:
        decoder = decoder_and_head(model)[0]
    except ConfigError:
        return None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return None
    total = sum(1 for m in model.modules() if _is_lora_layer(m))
    inside = [sum(1 for m in layer.modules() if _is_lora_layer(m)) for layer in layers]
    if total == 0 or sum(inside) != total:
        return None
    return layers[next(i for i, k in enumerate(inside) if k)]


class _LoraHooks:
    """While active: LoRA parameters frozen, dropout recorded, per-prompt weight grads formed
    in backward hooks into ``out[name][target]`` (``target`` = the prompt of the pass).

    Full-width passes are what a bf16 pass spends its time on (bench/README.md, "Paper profile
    of the per-prompt gradients"), so dropout's 1/(1-p) is applied to lora_A's (tokens, r)
    output rather than to its (tokens, d_in) input, and the hook rebuilds the dropped input
    by masking the layer's own input in its dtype (exact) before one upcast.
    """

    def __init__(self, model: torch.nn.Module, params: dict[str, torch.nn.Parameter],
                 out: PerPromptGrads) -> None:
        self.out, self.params, self.target = out, params, 0
        self.handles: list[Any] = []
        self.swapped: list[tuple[torch.nn.ModuleDict, str, torch.nn.Module]] = []
        self.leaves: list[torch.Tensor] = []
        self.stash: dict[int, dict[str, Any]] = {}
        covered: set[str] = set()
        try:
            for mname, module in model.named_modules():
                if _is_lora_layer(module):
                    covered |= self._wrap(mname, module)
            missing = sorted(set(params) - covered)
            if missing:
                raise ConfigError(
                    "per_prompt_grads_fast covers only PEFT LoRA lora_A/lora_B weights; these "
                    f"trainable parameters have no per-prompt hook: {missing[:5]}"
                    f"{' ...' if len(missing) > 5 else ''}. Use grad_method = 'reference'.")
            first = first_adapted_layer(model)
            if first is None:
                # Module.__getattr__ is typed Tensor | Module; the model is a transformers one
                embed = cast(Callable[[], torch.nn.Module], model.get_input_embeddings)()
                self.handles.append(embed.register_forward_hook(self._embed_hook))
            else:
                self.handles.append(first.register_forward_pre_hook(self._layer_input_hook,
                                                                    with_kwargs=True))
            for p in params.values():
                p.requires_grad_(False)
        except BaseException:
            self.remove()
            raise

    def _wrap(self, mname: str, module: torch.nn.Module) -> set[str]:
        covered: set[str] = set()
        slot: dict[str, Any] = {}
        self.stash[id(module)] = slot
        self.handles.append(module.register_forward_pre_hook(
            lambda mod, args: slot.__setitem__("x", args[0])))
        # _is_lora_layer checked lora_A; PEFT's LoRA layers hold lora_B/lora_dropout alike
        for adapter, lora_a in cast(torch.nn.ModuleDict, module.lora_A).items():
            lora_b = cast(torch.nn.ModuleDict, module.lora_B)[adapter]
            names_a = self._names(f"{mname}.lora_A.{adapter}", lora_a)
            names_b = self._names(f"{mname}.lora_B.{adapter}", lora_b)
            if not (names_a or names_b):
                continue
            covered |= set(names_a.values()) | set(names_b.values())
            dropout_dict = cast(torch.nn.ModuleDict, module.lora_dropout)
            dropout = dropout_dict[adapter]
            p = float(getattr(dropout, "p", 0.0)) if isinstance(dropout, torch.nn.Dropout) else 0.0
            if not isinstance(dropout, (torch.nn.Dropout, torch.nn.Identity)):
                raise ConfigError(f"unsupported LoRA dropout {type(dropout).__name__} in {mname}")

            def record_mask(m: torch.Tensor | None, s: dict[str, Any] = slot) -> None:
                s.__setitem__("mask", m)

            recorder = _RecordingDropout(p, record_mask, scaled=False)
            recorder.train(dropout.training)
            self.swapped.append((dropout_dict, adapter, dropout))
            dropout_dict[adapter] = recorder
            scale = 1.0 / (1.0 - p) if p > 0 else 1.0
            # lora_A's hook also applies dropout's 1/(1-p), so it stays even when lora_A is
            # frozen (model.lora_train = "B" or "bias"); it then forms no gradient
            self.handles.append(lora_a.register_forward_hook(self._hook_a(names_a, slot, scale)))
            if names_b:
                self.handles.append(lora_b.register_forward_hook(self._hook_b(names_b)))
        return covered

    def _names(self, prefix: str, layer: torch.nn.Module) -> dict[str, str]:
        return {k: f"{prefix}.{k}" for k in ("weight", "bias")
                if getattr(layer, k, None) is not None and f"{prefix}.{k}" in self.params}

    def _leaf(self, hidden: torch.Tensor) -> torch.Tensor:
        # A leaf that requires grad: backward reaches every LoRA layer through the
        # activations, while no parameter gradient is ever formed by autograd.
        leaf = hidden.detach().requires_grad_(True)
        self.leaves.append(leaf)
        return leaf

    def _embed_hook(self, module: torch.nn.Module, args: Any, output: torch.Tensor
                    ) -> torch.Tensor:
        return self._leaf(output)

    def _layer_input_hook(self, module: torch.nn.Module, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The first adapted layer's input: the frozen layers below it get no backward
        if args:
            return (self._leaf(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._leaf(kwargs["hidden_states"])}

    def _hook_a(self, names: dict[str, str], slot: dict[str, Any], scale: float
                ) -> Callable[..., torch.Tensor | None]:
        def hook(module: torch.nn.Module, args: Any, output: torch.Tensor
                 ) -> torch.Tensor | None:
            mask = slot.get("mask")
            if names and torch.is_grad_enabled() and output.requires_grad:
                saved: dict[str, Any] = {"x": slot.get("x"), "mask": mask, "target": self.target}
                dtype = module.weight.dtype

                def backward_hook(grad_out: torch.Tensor) -> None:
                    # grad_out is d loss / d (lora_A's unscaled output): 1/(1-p) is in it
                    x, m = saved.pop("x"), saved.pop("mask")
                    if m is not None:
                        x = torch.where(m, x, 0)      # exact in x's own dtype
                    self._accumulate(names, saved["target"], x.to(dtype), grad_out)

                output.register_hook(backward_hook)
            # the recorder left 1/(1-p) out of the dropped input: scale the (tokens, r) output
            return output * scale if mask is not None else None
        return hook

    def _hook_b(self, names: dict[str, str]) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled() or not output.requires_grad:
                return
            saved = {"x": args[0], "target": self.target}

            def backward_hook(grad_out: torch.Tensor) -> None:
                self._accumulate(names, saved["target"], saved.pop("x"), grad_out)

            output.register_hook(backward_hook)
        return hook

    def _accumulate(self, names: dict[str, str], target: int, x: torch.Tensor,
                    grad_out: torch.Tensor) -> None:
        first = self.out[next(iter(names.values()))]
        xf = x.reshape(-1, x.shape[-1]).to(first.dtype)                    # (tokens, d_in)
        gf = grad_out.reshape(-1, grad_out.shape[-1]).to(first.dtype)     # (tokens, d_out)
        if "weight" in names:
            self.out[names["weight"]][target].addmm_(gf.T, xf)            # (d_out, d_in)
        if "bias" in names:
            self.out[names["bias"]][target] += gf.sum(dim=0)              # (d_out,)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for container, adapter, original in self.swapped:
            container[adapter] = original
        self.swapped.clear()
        for p in self.params.values():
            p.requires_grad_(True)
        self.stash.clear()


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
    hooks = _LoraHooks(model, params, out)
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
