"""The vLLM rollout engine (GPU; ``pip install 'dpgrpo[vllm]'``, ``train.rollout_engine = "vllm"``).

vLLM serves the public base model; the policy's LoRA adapter is saved to a private temporary
folder whenever its weights changed since the last call and passed as a new ``LoRARequest``
(a fresh id, so vLLM loads it): the base weights are never reloaded. Prompts go in as token ids
(same chat template and tokenizer as the transformers engine), each completion is one request
with its own 63-bit seed (a ChaCha20 function of the prompt's 256-bit seed and the row index;
in training the prompt's seed is bound to its round and slot, privacy/record_coins.py),
and the output is the same :class:`~dpgrpo.rollout.batch.RolloutBatch`.

Record isolation. vLLM's continuous batching mixes requests in every forward pass. A seeded
request samples from its own ``torch.Generator``, so in exact arithmetic its tokens do not
depend on the other requests in the batch; in floating point they can (vLLM's kernels are not
batch-invariant unless ``VLLM_BATCH_INVARIANT=1``, a beta feature). So ``isolated=True`` sends
each prompt's G requests in a ``generate`` call of their own, with prefix caching off (a cached
prefix block could have been computed next to another prompt): the same guarantee as the
transformers engine's isolated mode. Batched mode sends all requests together.

Where it has run: this module is written against vLLM's documented offline API (``LLM``,
``SamplingParams(seed=...)``, ``LoRARequest``, ``enable_lora``) and tested here against a fake
``vllm`` module (``tests/rollout/test_vllm_engine.py``); its contract test against real vLLM
runs only where vLLM and a GPU are present and has never been run: vLLM was not installed on
any machine dpgrpo was developed on. The certificate says so (:data:`UNVERIFIED`).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from dpgrpo.rollout.engine import check_request, plan_calls, prompt_seeds, request_seed
from dpgrpo.rollout.sampling import SamplerSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm import LLM
    from vllm.lora.request import LoRARequest

INSTALL = "pip install 'dpgrpo[vllm]' (a CUDA GPU is needed)"
#: max_lora_rank values vLLM accepts
_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)

UNVERIFIED = ("; this engine has not been run by dpgrpo's tests against real vLLM, so the "
              "statement rests on vLLM's documented behaviour, not on a measurement")
ISOLATED = ("isolated (vllm): each prompt's completions were generated in a vLLM call holding "
            "that prompt's requests alone, prefix caching off, each request with its own seed, "
            "so they do not depend on which prompts shared the round" + UNVERIFIED)
BATCHED = ("batched (vllm): requests of several prompts shared vLLM's continuous batches; each "
           "request has its own seed, so in exact arithmetic its completion does not depend on "
           "its batch-mates, but vLLM's kernels are not batch-invariant{invariant}, so it can "
           "differ in the last bits (the paper's A2 gap, not quantified; set "
           "train.rollout_isolation = 'isolated' to remove it)" + UNVERIFIED)


def isolation_text(isolated: bool) -> str:
    """The certificate's statement for this engine; batched mode says whether vLLM's batch
    invariance (``VLLM_BATCH_INVARIANT=1``) was requested."""
    if isolated:
        return ISOLATED
    invariant = os.environ.get("VLLM_BATCH_INVARIANT") == "1"
    return BATCHED.format(invariant=" (VLLM_BATCH_INVARIANT=1 was set: vLLM states batch "
                          "invariance, a beta feature, not verified here)" if invariant else "")


def vllm_available() -> bool:
    """Whether ``import vllm`` can succeed (without importing it)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    return importlib.util.find_spec("vllm") is not None


def require_vllm(device: str | None = None) -> None:
    """Refuse, before any round, a vLLM run that cannot work: vLLM missing, or not on CUDA."""
    if not vllm_available():
        raise ConfigError(f"train.rollout_engine = 'vllm' needs vLLM: {INSTALL}")
    if device is not None and not str(device).startswith("cuda"):
        raise ConfigError(f"train.rollout_engine = 'vllm' runs on a CUDA GPU, not on {device!r}; "
                          "use train.rollout_engine = 'transformers'")


def base_model_path(name: str) -> tuple[str, str]:
    """``(model, tokenizer)`` locations vLLM can load for the public base model ``name``: a
    local folder or hub id as is; an alias or GGUF file through dpgrpo's dequantized cache."""
    from dpgrpo.model import gguf_cache_dir, resolve_model

    source = resolve_model(name)
    if source.gguf_file is None:
        return source.location, source.location
    cache = gguf_cache_dir(source)
    if cache is None or not (cache / "model").is_dir() or not (cache / "tokenizer").is_dir():
        raise ConfigError(f"vLLM needs the dequantized copy of {name} in dpgrpo's cache: load "
                          "it once with the transformers engine and keep DPGRPO_CACHE on")
    return str(cache / "model"), str(cache / "tokenizer")


def _rank(model: object) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds the adapter's rank."""
    wanted = max((int(getattr(cfg, "r", 8)) for cfg in getattr(model, "peft_config", {}).values()),
                 default=8)
    return next((r for r in _RANKS if r >= wanted), wanted)


class VLLMEngine:
    """Rollouts from a colocated ``vllm.LLM`` of the base model plus the policy's adapter."""

    name = "vllm"

    def __init__(self, model: Any, tokenizer: PreTrainedTokenizerBase, *, model_name: str,
                 isolated: bool = False,
                 rows_per_call: int | None = None, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.4, max_model_len: int | None = None,
                 llm: LLM | None = None) -> None:
        require_vllm()
        check_request(1, 1, rows_per_call)
        self.model, self.tokenizer = model, tokenizer
        self.isolated, self.rows_per_call = isolated, rows_per_call
        self._adapter_dir = Path(tempfile.mkdtemp(prefix="dpgrpo-vllm-lora-"))
        os.chmod(self._adapter_dir, 0o700)          # adapters of a private run: owner only
        atexit.register(shutil.rmtree, self._adapter_dir, True)
        self._version, self._request = 0, None
        self._digest: bytes | None = None           # sha256 of the adapter last saved
        if llm is None:
            from vllm import LLM

            path, tok_path = base_model_path(model_name)
            llm = LLM(model=path, tokenizer=tok_path, dtype=dtype, enable_lora=True,
                      max_loras=1, max_lora_rank=_rank(model), skip_tokenizer_init=True,
                      enable_prefix_caching=not isolated, max_model_len=max_model_len,
                      gpu_memory_utilization=gpu_memory_utilization)
        self.llm = llm

    @property
    def isolation(self) -> str:
        return isolation_text(self.isolated)

    def lora_request(self) -> LoRARequest:
        """The current adapter as a LoRARequest; saved again only when its weights changed."""
        from peft import get_peft_model_state_dict
        from vllm.lora.request import LoRARequest

        digest = hashlib.sha256()
        for key, value in sorted(get_peft_model_state_dict(self.model).items()):
            digest.update(key.encode())
            digest.update(value.detach().float().cpu().numpy().tobytes())
        if self._request is not None and digest.digest() == self._digest:
            return self._request
        self._version += 1
        target = self._adapter_dir / f"v{self._version}"
        self.model.save_pretrained(str(target))
        if self._request is not None:
            shutil.rmtree(self._request.lora_path, ignore_errors=True)
        self._request = LoRARequest(f"dpgrpo-{self._version}", self._version, str(target))
        self._digest = digest.digest()
        return self._request

    def generate(self, user_messages: Sequence[Message], *, group_size: int, temperature: float,
                 max_new_tokens: int, seeds: Sequence[int] | None = None,
                 generator: torch.Generator | None = None, use_adapter: bool = True,
                 top_p: float = 1.0, repetition_penalty: float = 1.0) -> RolloutBatch:
        """See :meth:`dpgrpo.rollout.engine.RolloutEngine.generate`."""
        from vllm import SamplingParams

        check_request(group_size, max_new_tokens)
        SamplerSettings(temperature, top_p, repetition_penalty)
        if not user_messages:
            return empty_batch(group_size)
        seeds = prompt_seeds(seeds, generator, len(user_messages))
        prompts = chat_prompt_ids(self.tokenizer, user_messages)
        stop, pad_id = stop_ids(self.model, self.tokenizer), int(self.tokenizer.pad_token_id)
        lora = self.lora_request() if use_adapter else None
        requests = [({"prompt_token_ids": prompts[p]}, SamplingParams(
            n=1, temperature=float(temperature), top_p=float(top_p),
            repetition_penalty=float(repetition_penalty), max_tokens=max_new_tokens,
            seed=request_seed(seeds[p], j), stop_token_ids=stop, detokenize=False))
            for p in range(len(prompts)) for j in range(group_size)]
        generated = torch.full((len(requests), max_new_tokens), pad_id, dtype=torch.long)
        for rows in plan_calls([len(p) for p in prompts], group_size, self.rows_per_call,
                               self.isolated):
            outputs = self.llm.generate([requests[r][0] for r in rows],
                                        [requests[r][1] for r in rows],
                                        lora_request=lora, use_tqdm=False)
            for row, output in zip(rows, outputs):
                done = output.outputs[0]
                ids = list(done.token_ids)[:max_new_tokens]
                if done.finish_reason == "stop" and (not ids or ids[-1] not in stop) \
                        and len(ids) < max_new_tokens:
                    ids.append(stop[0])                    # stopped by a stop id vLLM dropped
                if ids:
                    generated[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        return assemble(self.tokenizer, prompt_ids.repeat_interleave(group_size, 0),
                        prompt_mask.repeat_interleave(group_size, 0), generated, stop, pad_id,
                        group_size, len(prompts), max_new_tokens)


__all__ = ["BATCHED", "INSTALL", "ISOLATED", "UNVERIFIED", "VLLMEngine", "base_model_path",
           "isolation_text", "require_vllm", "vllm_available"]
