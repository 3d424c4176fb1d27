"""The fast path's hooks: per-prompt LoRA weight gradients formed inside one backward.

:func:`dpgrpo.training.grads.per_prompt_grads_fast` runs one forward/backward per pass with
:class:`LoraHooks` installed on the PEFT LoRA layers; this module is that machinery, apart
from the public per-prompt gradient functions so they stay readable. While the hooks are on,
the LoRA parameters are frozen (autograd saves none of their inputs) and each weight gradient
``sum over tokens of grad_out (x) input`` is formed in a backward hook into the gradient of
the pass's prompt (``out[name][target]``). The hooks keep the layer's *original* input
(shared by q/k/v, gate/up) and LoRA dropout's boolean mask (:class:`_RecordingDropout`) and
rebuild the dropped, upcast input when the gradient arrives: no per-layer fp32 copy of the
activations lives until backward. The backward starts at the input of the lowest adapted
decoder layer (:func:`first_adapted_layer`): the frozen layers below record no graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle


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
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[object, ...]:
        (mask,) = ctx.saved_tensors
        out = torch.where(mask, grad, 0)
        return (out if ctx.scale == 1.0 else out.mul_(ctx.scale)), None, None


class _RecordingDropout(torch.nn.Module):
    """LoRA dropout that tells the hooks its mask instead of leaving a dropped copy behind.

    ``scaled=False`` leaves out the 1/(1-p) factor: the hooks apply it to lora_A's rank-r
    output instead (the same product, one full-width pass fewer each way: see LoraHooks).
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
        return cast(torch.Tensor, _MaskedScale.apply(x, mask,
                                                    1.0 / (1.0 - self.p) if self.scaled else 1.0))


def _is_lora_layer(module: torch.nn.Module) -> bool:
    return (isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict)
            and hasattr(module, "base_layer"))


def adapted_layer_index(model: torch.nn.Module) -> int | None:
    """The index of :func:`first_adapted_layer` in the decoder's ``layers`` (None if none)."""
    from dpgrpo.objectives.logprobs import decoder_and_head

    if not isinstance(model, torch.nn.Module):
        return None
    layer = first_adapted_layer(model)
    if layer is None:
        return None
    layers = cast(torch.nn.ModuleList, decoder_and_head(model)[0].layers)
    return next(i for i, one in enumerate(layers) if one is layer)


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


class LoraHooks:
    """While active: LoRA parameters frozen, dropout recorded, per-prompt weight grads formed
    in backward hooks into ``out[name][target]`` (``target`` = the prompt of the pass).

    Full-width passes are what a bf16 pass spends its time on (bench/README.md, "Paper profile
    of the per-prompt gradients"), so dropout's 1/(1-p) is applied to lora_A's (tokens, r)
    output rather than to its (tokens, d_in) input, and the hook rebuilds the dropped input
    by masking the layer's own input in its dtype (exact) before one upcast.
    """

    def __init__(self, model: torch.nn.Module, params: dict[str, torch.nn.Parameter],
                 out: dict[str, torch.Tensor]) -> None:   # name -> (B, *param.shape)
        self.out, self.params, self.target = out, params, 0
        self.handles: list[RemovableHandle] = []
        self.swapped: list[tuple[torch.nn.ModuleDict, str, torch.nn.Module]] = []
        self.leaves: list[torch.Tensor] = []
        self.stash: dict[int, dict[str, object]] = {}
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
        slot: dict[str, object] = {}
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

            def record_mask(m: torch.Tensor | None, s: dict[str, object] = slot) -> None:
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

    def _embed_hook(self, module: torch.nn.Module, args: object, output: torch.Tensor
                    ) -> torch.Tensor:
        return self._leaf(output)

    def _layer_input_hook(self, module: torch.nn.Module, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> tuple[tuple[object, ...], dict[str, object]]:
        # The first adapted layer's input: the frozen layers below it get no backward
        if args:
            return (self._leaf(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._leaf(kwargs["hidden_states"])}

    def _hook_a(self, names: dict[str, str], slot: Mapping[str, object], scale: float
                ) -> Callable[..., torch.Tensor | None]:
        def hook(module: torch.nn.Module, args: object, output: torch.Tensor
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
