"""A tiny random causal LM and tokenizer, built offline in about a second.

Used by ``dpgrpo verify``'s model checks (:mod:`dpgrpo.verify.model`), by the tests and by the
benchmarks. The model is a 2-layer Llama (the SmolLM2 architecture) with random weights; the
tokenizer is a byte-level BPE trained on a fixed corpus, with a ChatML chat template, so every
code path that needs ``apply_chat_template``, padding and EOS works without a download.
"""

from __future__ import annotations

from pathlib import Path

_CORPUS = [
    "What is 12 plus 30? The answer is 42.",
    "Tom has 3 apples and buys 4 more. How many apples does he have? 7",
    "Answer: A B C D E. The final answer is \\boxed{5}.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) , . ? ! : ; # $ % { } [ ] \\ ^ _",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "You are a helpful assistant. Solve the problem step by step.",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer(vocab_size: int = 512):
    """Train a small byte-level BPE tokenizer with ChatML special tokens (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(tokenizer, *, seed: int = 0, hidden_size: int = 32, layers: int = 2,
                     dtype: str = "float32"):
    """A random 2-layer Llama whose vocabulary matches ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(getattr(torch, dtype))


def save_tiny_model(directory: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny model and tokenizer to ``directory`` (loadable with ``from_pretrained``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def exact_rmsnorm(model) -> None:
    """Make RMSNorm compute in the model's dtype (HF's Llama norm upcasts to fp32 only), so a
    float64 model is float64 end to end, as the paper's binary64 checks require."""
    import types

    import torch

    def forward(self, h):
        return self.weight * (
            h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(forward, module)


def _tiny_policy(tok, dtype: str, seed: int, lora_scale: float):
    """A tiny Llama of ``dtype`` with a seeded LoRA adapter whose B is nonzero, dropout off."""
    import torch

    from dpgrpo.model_adapters import LoraSettings, attach_lora

    base = build_tiny_model(tok, dtype=dtype)
    if dtype == "float64":
        exact_rmsnorm(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)                      # LoRA's A initialization
        model = attach_lora(base, LoraSettings(dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * lora_scale)
    return model.eval()


def tiny_fp64_policy(*, seed: int = 7, lora_scale: float = 0.2):
    """(peft model, tokenizer): a float64 tiny Llama with a nonzero LoRA adapter, dropout off."""
    tok = build_tiny_tokenizer()
    return _tiny_policy(tok, "float64", seed, lora_scale), tok


def tiny_fp32_policy(tok, *, seed: int = 11, lora_scale: float = 0.2):
    """A float32 tiny Llama with a nonzero LoRA adapter, dropout off, in eval mode: fp32
    rounding shows any coupling between batch-mates that fp64 would hide."""
    return _tiny_policy(tok, "float32", seed, lora_scale)


def synthetic_rollouts(tok, num_prompts: int, group: int, *, seed: int = 0, cap: int = 7):
    """A RolloutBatch with left-padded prompts of unequal length and completions of unequal
    length (some hitting the cap), without running generation."""
    import torch

    from dpgrpo.rollout import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    messages = [_CORPUS[i % len(_CORPUS)] for i in range(num_prompts)]
    texts = [tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                     add_generation_prompt=True) for m in messages]
    enc = tok(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    )
    n = num_prompts * group
    lengths = torch.tensor([1 + (r * 3) % cap for r in range(n)])
    lengths = lengths[torch.randperm(n, generator=gen)]
    comp = torch.randint(3, len(tok), (n, cap), generator=gen)
    ended = lengths < cap
    comp[torch.arange(n)[ended], lengths[ended] - 1] = tok.eos_token_id
    cmask = (torch.arange(cap).unsqueeze(0) < lengths.unsqueeze(1)).long()
    comp = torch.where(cmask.bool(), comp, tok.pad_token_id)
    pids = enc["input_ids"].repeat_interleave(group, 0)
    pmask = enc["attention_mask"].repeat_interleave(group, 0)
    return RolloutBatch(texts=[[""] * group] * num_prompts, input_ids=torch.cat([pids, comp], 1),
                        attention_mask=torch.cat([pmask, cmask], 1),
                        completion_mask=torch.cat([torch.zeros_like(pmask), cmask], 1),
                        completion_lengths=lengths, hit_cap=~ended, group_size=group,
                        num_prompts=num_prompts)


def rollouts_from_specs(tok, specs):
    """A RolloutBatch for ``(message, [completion token lists])`` specs (equal group sizes),
    padded to the batch's widths exactly as :func:`dpgrpo.rollout.generate` pads them."""
    import torch

    from dpgrpo.rollout.batch import assemble

    group = len(specs[0][1])
    texts = [tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                     add_generation_prompt=True) for m, _ in specs]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
    width = max(len(c) for _, comps in specs for c in comps)
    gen = torch.full((len(specs) * group, width), tok.pad_token_id, dtype=torch.long)
    for i, (_, comps) in enumerate(specs):
        for r, c in enumerate(comps):
            gen[i * group + r, :len(c)] = torch.tensor(c)
    return assemble(tok, enc["input_ids"].repeat_interleave(group, 0),
                    enc["attention_mask"].repeat_interleave(group, 0), gen,
                    [tok.eos_token_id], tok.pad_token_id, group, len(specs), width)


def random_specs(tok, seed: int, num_prompts: int, group: int = 3, *, long: bool = False):
    """Random (message, completions) specs; ``long`` makes prompts and completions much longer."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_prompts):
        message = _CORPUS[(seed + i) % len(_CORPUS)] * (6 if long else 1)
        comps = []
        for _ in range(group):
            length = int(torch.randint(2, 30 if long else 9, (1,), generator=gen))
            comps.append([*torch.randint(3, len(tok), (length,), generator=gen).tolist(),
                          tok.eos_token_id])
        out.append((message, comps))
    return out
