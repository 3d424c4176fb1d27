"""The GRPO loss options of ``train.loss_type`` and ``train.scale_rewards``, and the values
other GRPO trainers offer that cannot hold under prompt-level DP, each with its reason.

Read by the config (validation), the objective (:class:`dpgrpo.objectives.grpo.GRPOObjective`)
and :func:`dpgrpo.config.trl.from_trl_config`. Torch-free, so the config can import it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from dpgrpo.errors import ConfigError

LossType = Literal["grpo", "dr_grpo", "prompt_token_mean"]   # the keys of LOSS_TYPES
ScaleRewards = Literal["group", "none"]                      # the keys of SCALE_REWARDS

#: train.loss_type -> what normalises a completion's token sum in the per-prompt loss; every
#: normaliser comes from ONE prompt's rows or from public constants (Section III-C, remark 1)
LOSS_TYPES: dict[LossType, str] = {
    "grpo": "each completion's token sum over its own length (Eq. 7; TRL's 'grpo')",
    "dr_grpo": "each completion's token sum over the public completion cap (Dr. GRPO, Liu et "
               "al. 2025; TRL's 'dr_grpo'); with train.scale_rewards = 'none' for all of Dr. GRPO",
    "prompt_token_mean": "the prompt's token sum over the tokens of its own G completions "
                         "(DAPO's token-level mean, Yu et al. 2025, counted per prompt)",
}
#: train.scale_rewards -> how a group's centred rewards are scaled (Eq. 2 within the group)
SCALE_REWARDS: dict[ScaleRewards, str] = {
    "group": "divided by the group's own standard deviation + 1e-4 (Eq. 2; TRL's 'group')",
    "none": "centred on the group mean only (Dr. GRPO; TRL's 'none' / False)",
}
#: values other GRPO trainers offer that cannot hold under prompt-level DP, with the reason
REFUSED = {
    ("loss_type", "dapo"): "DAPO's normaliser is the token count of the whole (global) batch, "
        "so one prompt's completion lengths would scale every other prompt's gradient before "
        "clipping and void the sensitivity bound (Section III-C, first remark); use "
        "train.loss_type = 'prompt_token_mean', the same token-level mean counted over one "
        "prompt's G completions",
    ("loss_type", "bnpo"): "BNPO's normaliser is the token count of the local batch, shared by "
        "its prompts, so one prompt's completion lengths would scale the others' gradients "
        "before clipping and void the sensitivity bound (Section III-C, first remark); use "
        "train.loss_type = 'prompt_token_mean', the same token-level mean counted over one "
        "prompt's G completions",
    ("scale_rewards", "batch"): "a batch-level standard deviation is a statistic of every "
        "sampled prompt's rewards, so one prompt would change every other prompt's advantages "
        "(Section III-D: advantage whitening across prompts breaks the record); use 'group' "
        "(each prompt's own std) or 'none'",
}


def refuse(key: str, value: str, known: Collection[str]) -> None:
    """ConfigError for train.<key> = value: the privacy reason if refused, else the choices."""
    reason = REFUSED.get((key, value))
    if reason is not None:
        raise ConfigError(f"train.{key} = {value!r} cannot hold under prompt-level DP: {reason}")
    raise ConfigError(f"train.{key} must be one of {', '.join(known)}, not {value!r}")


__all__ = ["LOSS_TYPES", "REFUSED", "SCALE_REWARDS", "LossType", "ScaleRewards", "refuse"]
