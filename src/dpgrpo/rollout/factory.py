"""Building an engine by name (``train.rollout_engine``) and its certificate statement.

Kept apart from :mod:`dpgrpo.rollout.engine` (the interface and the helpers the engines share),
which both engines import: the engines never import this module, so there is no import circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpgrpo.errors import ConfigError
from dpgrpo.rollout.engine import ENGINES, RolloutEngine

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from dpgrpo.model import Policy


def isolation_statement(engine: str, rollout_mode: str) -> str:
    """What ``engine`` in ``rollout_mode`` ("isolated" or "batched") guarantees about a prompt's
    batch-mates: the text of the certificate's ``record_isolation.rollouts``."""
    if engine == "vllm":
        from dpgrpo.rollout.vllm_engine import isolation_text
    else:
        from dpgrpo.rollout.transformers_engine import isolation_text
    return isolation_text(rollout_mode == "isolated")


def make_engine(name: str, model: torch.nn.Module | Policy,
                tokenizer: PreTrainedTokenizerBase, *, isolated: bool = False,
                rows_per_call: int | None = None, model_name: str | None = None,
                dtype: str | None = None, **options: Any) -> RolloutEngine:
    """The engine ``name`` over ``model`` (a PeftModel, a plain causal LM or a Policy).

    ``rows_per_call`` bounds the rows of one batch (transformers) or of one ``generate`` call
    (vLLM). vLLM loads the public base model ``model_name`` itself, in ``dtype`` (the
    transformers engine runs ``model`` as it is). Extra ``options`` go to the constructor.
    """
    from dpgrpo.model import Policy

    if isinstance(model, Policy):
        model, tokenizer = model.model, tokenizer or model.tokenizer
    if name == "transformers":
        from dpgrpo.rollout.transformers_engine import TransformersEngine

        return TransformersEngine(model, tokenizer, isolated=isolated,
                                  rows_per_call=rows_per_call, **options)
    if name == "vllm":
        from dpgrpo.rollout.vllm_engine import VLLMEngine, require_vllm

        require_vllm()
        if model_name is None:
            raise ConfigError("the vllm engine needs the base model's name (model.name)")
        return VLLMEngine(model, tokenizer, model_name=model_name, isolated=isolated,
                          rows_per_call=rows_per_call, dtype=dtype or "bfloat16", **options)
    raise ConfigError(f"rollout engine must be one of {', '.join(ENGINES)}; got {name!r}")


__all__ = ["isolation_statement", "make_engine"]
