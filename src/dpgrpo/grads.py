"""Per-prompt gradients of the trainable (LoRA) parameters: the records DP-SGD clips.

The record is a prompt with all of its rows (Section III-D), so each gradient returned here is
the gradient of one prompt's loss ``sum_r row_weights[i, r] * row_loss[i, r]`` (Eq. 7), never
a per-completion gradient. Results map each trainable parameter name to a tensor of shape
``(B, *param.shape)`` in fp32 (fp64 for fp64 parameters); ``privacy.mechanism`` is the only
place where prompts are combined. Parameters' ``.grad`` fields are never touched.

Two implementations that agree up to floating-point summation order:

* :func:`per_prompt_grads_reference`: one backward per prompt (Algorithm 1, line 6),
  optionally chunked over that prompt's rows; the chunks are accumulated before anything else
  happens, and the per-prompt row weights make the chunk sum exact (Appendix B, "Rollout-chunked
  backward identity").
* :func:`per_prompt_grads_fast`: one forward/backward over the whole batch of the summed
  per-prompt losses. Hooks on the LoRA ``lora_A`` / ``lora_B`` linear layers capture each
  layer's input and output gradient and form, inside the backward, each prompt's weight
  gradient ``sum over its rows and tokens of grad_out (x) input``. Since no loss term mixes
  prompts, the gradient that reaches prompt i's rows is exactly that of prompt i's loss.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dpgrpo.errors import ConfigError
from dpgrpo.objectives import Objective, TrainBatch

PerPromptGrads = dict[str, torch.Tensor]   # name -> (B, *param.shape)

_LORA_PARTS = ("lora_A", "lora_B")


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Name -> parameter for every parameter that requires grad."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _acc_dtype(param: torch.Tensor) -> torch.dtype:
    return torch.promote_types(param.dtype, torch.float32)


def _zeros(params: dict[str, torch.nn.Parameter], num_prompts: int) -> PerPromptGrads:
    return {n: torch.zeros((num_prompts, *p.shape), dtype=_acc_dtype(p), device=p.device)
            for n, p in params.items()}


def _weighted_loss(objective: Objective, model: torch.nn.Module, batch: TrainBatch,
                   rows: slice, weights: torch.Tensor) -> torch.Tensor:
    losses = objective.row_losses(model, batch, rows)                     # (n,)
    return (losses * weights.reshape(-1).to(losses)).sum()


def prompt_gradient(model: torch.nn.Module, objective: Objective, batch: TrainBatch,
                    prompt: int, *, chunk_size: int | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradient of one prompt (Eq. 7), its rows processed ``chunk_size`` at a time.

    Returns the detached scalar loss and name -> (*param.shape) gradients, accumulated over
    all chunks (clipping, if any, comes after this).
    """
    params = trainable_parameters(model)
    r = batch.rows_per_prompt
    step = chunk_size or r
    if step < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    start = batch.prompt_rows(prompt).start
    grads = {n: torch.zeros(p.shape, dtype=_acc_dtype(p), device=p.device)
             for n, p in params.items()}
    total: torch.Tensor | None = None
    for c in range(0, r, step):
        rows = slice(start + c, start + min(c + step, r))
        loss = _weighted_loss(objective, model, batch, rows,
                              batch.row_weights[prompt, c:c + step])
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
                               batch: TrainBatch, *,
                               chunk_size: int | None = None) -> PerPromptGrads:
    """One backward per prompt (Algorithm 1, line 6): name -> (B, *param.shape)."""
    out = _zeros(trainable_parameters(model), batch.num_prompts)
    for i in range(batch.num_prompts):
        _, grads = prompt_gradient(model, objective, batch, i, chunk_size=chunk_size)
        for name, g in grads.items():
            out[name][i] = g
    return out


class _PerPromptHooks:
    """Forward/backward hooks on the LoRA linears that accumulate per-prompt weight grads."""

    def __init__(self, model: torch.nn.Module, params: dict[str, torch.nn.Parameter],
                 out: PerPromptGrads, rows_per_prompt: int) -> None:
        self.out, self.rows_per_prompt = out, rows_per_prompt
        self.offset, self.count = 0, 0
        self.handles: list[Any] = []
        self.embed_out: list[torch.Tensor] = []
        covered: set[str] = set()
        for mname, module in model.named_modules():
            parts = mname.split(".")
            if not isinstance(module, torch.nn.Linear) or not any(p in parts for p in _LORA_PARTS):
                continue
            names = {k: f"{mname}.{k}" for k in ("weight", "bias")
                     if getattr(module, k, None) is not None and f"{mname}.{k}" in params}
            if names:
                covered.update(names.values())
                self.handles.append(module.register_forward_hook(self._forward(names)))
        missing = sorted(set(params) - covered)
        if missing:
            self.remove()
            raise ConfigError(
                "per_prompt_grads_fast covers only LoRA lora_A/lora_B linear layers; these "
                f"trainable parameters have no per-prompt hook: {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}. Use per_prompt_grads_reference.")
        embed = model.get_input_embeddings()
        self.handles.append(embed.register_forward_hook(self._embed_hook))

    def _embed_hook(self, module: torch.nn.Module, args: Any, output: torch.Tensor
                    ) -> torch.Tensor:
        # A leaf that requires grad: backward reaches every LoRA layer through the
        # activations, while torch.autograd.grad never computes the summed weight grads.
        leaf = output.detach().requires_grad_(True)
        self.embed_out.append(leaf)
        return leaf

    def _forward(self, names: dict[str, str]) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled() or not output.requires_grad:
                return
            saved = {"x": args[0]}

            def backward_hook(grad_out: torch.Tensor) -> None:
                self._accumulate(names, saved.pop("x"), grad_out)   # frees the input early

            output.register_hook(backward_hook)
        return hook

    def _accumulate(self, names: dict[str, str], x: torch.Tensor, grad_out: torch.Tensor
                    ) -> None:
        b = self.count
        weight = self.out[names["weight"]] if "weight" in names else None
        dtype = (weight if weight is not None else self.out[names["bias"]]).dtype
        xb = x.reshape(b, -1, x.shape[-1]).to(dtype)                    # (B, R*L, d_in)
        gb = grad_out.reshape(b, -1, grad_out.shape[-1]).to(dtype)      # (B, R*L, d_out)
        sl = slice(self.offset, self.offset + b)
        if weight is not None:
            weight[sl].baddbmm_(gb.transpose(1, 2), xb)                 # (B, d_out, d_in)
        if "bias" in names:
            self.out[names["bias"]][sl] += gb.sum(dim=1)                # (B, d_out)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def per_prompt_grads_fast(model: torch.nn.Module, objective: Objective, batch: TrainBatch,
                          *, prompts_per_pass: int | None = None) -> PerPromptGrads:
    """One forward/backward for the whole batch, split by prompt in LoRA hooks.

    Returns name -> (B, *param.shape). ``prompts_per_pass`` bounds memory by running several
    passes over disjoint sets of whole prompts (default: one pass). Raises ConfigError if a
    trainable parameter is not a LoRA linear weight (no hook could split its gradient).
    """
    params = trainable_parameters(model)
    b, r = batch.num_prompts, batch.rows_per_prompt
    out = _zeros(params, b)
    if b == 0 or r == 0:
        return out
    step = prompts_per_pass or b
    hooks = _PerPromptHooks(model, params, out, r)
    try:
        for start in range(0, b, step):
            count = min(step, b - start)
            hooks.offset, hooks.count = start, count
            hooks.embed_out.clear()
            rows = slice(start * r, (start + count) * r)
            loss = _weighted_loss(objective, model, batch, rows,
                                  batch.row_weights[start:start + count])   # sum of prompts
            if loss.requires_grad:
                torch.autograd.grad(loss, hooks.embed_out)
            hooks.embed_out.clear()
    finally:
        hooks.remove()
    return out


def per_prompt_grads(model: torch.nn.Module, objective: Objective, batch: TrainBatch, *,
                     method: str = "fast", chunk_size: int | None = None) -> PerPromptGrads:
    """Dispatch to the ``fast`` path or the per-prompt ``reference`` loop."""
    if method == "fast":
        return per_prompt_grads_fast(model, objective, batch)
    if method == "reference":
        return per_prompt_grads_reference(model, objective, batch, chunk_size=chunk_size)
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
