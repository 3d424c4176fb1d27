"""Rollouts: G completions per prompt (Algorithm 1, line 4), behind one engine interface.

``make_engine("transformers" | "vllm", model, tokenizer, isolated=...)`` returns a
:class:`RolloutEngine`; :func:`generate` is the transformers engine as one function call.
"""

from dpgrpo.rollout.batch import RolloutBatch
from dpgrpo.rollout.engine import ENGINES, RolloutEngine
from dpgrpo.rollout.factory import make_engine
from dpgrpo.rollout.generate import generate, hf_generate

__all__ = ["ENGINES", "RolloutBatch", "RolloutEngine", "generate", "hf_generate", "make_engine"]
