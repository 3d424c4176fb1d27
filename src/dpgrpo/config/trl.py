"""TRL's ``GRPOConfig`` options mapped onto dpgrpo's configuration: :func:`from_trl_config`.

::

    args = GRPOConfig(num_generations=8, max_completion_length=256, loss_type="dr_grpo",
                      scale_rewards=False, learning_rate=1e-5, beta=0.04, max_steps=50)
    dpgrpo.train(model=..., problems=dataset, rewards=[accuracy], n_slots=1000,
                 **dpgrpo.from_trl_config(args))

``args`` is a ``GRPOConfig`` (any object with the attributes: trl is never imported) or a dict.
An object is read for every option of :data:`OPTIONS`; a dict maps only the keys it names (the
others keep dpgrpo's defaults) and may not name others. Each option is mapped, accepted with a
note (it changes nothing here, and the note says why), or refused with a
:class:`~dpgrpo.errors.ConfigError` that gives the reason, a privacy one where the option
would share a statistic across prompts before clipping (Section III-C, first remark) or feed
private data to logs. docs/coming-from-trl.md has the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpgrpo.config.losses import LOSS_TYPES, REFUSED
from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from dpgrpo.config.schema import RunConfig

log = logging.getLogger(__name__)
_UNSET = object()

ON_POLICY = ("dpgrpo takes exactly one noisy gradient step per Poisson-sampled batch "
             "(Algorithm 1), so the importance ratio is exactly 1 and a ratio clip never binds "
             "(as in TRL with num_iterations = 1 and one optimizer step per generation)")
REUSE = ("several optimizer steps on one sampled batch would release that batch's records "
         "several times while the ledger charges one subsampled-Gaussian event per round; "
         "dpgrpo runs one pass per round: raise train.rounds instead")


@dataclass(frozen=True)
class TRLSettings(Mapping[str, Any]):
    """What :func:`from_trl_config` found: dpgrpo ``overrides`` (``"train.beta": 0.04``, ...),
    the ``reward_weights`` and ``notes`` on options accepted without effect or mapped with a
    caveat.

    A mapping of :func:`dpgrpo.train`'s keyword arguments (``overrides`` and, when set,
    ``reward_weights``), so ``dpgrpo.train(..., **settings)`` applies it.
    """

    overrides: dict[str, object] = field(default_factory=dict)
    reward_weights: tuple[float, ...] | None = None
    notes: tuple[str, ...] = ()

    def _kwargs(self) -> dict[str, object]:
        out: dict[str, object] = {"overrides": dict(self.overrides)}
        if self.reward_weights is not None:
            out["reward_weights"] = list(self.reward_weights)
        return out

    def __getitem__(self, key: str) -> object:
        return self._kwargs()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kwargs())

    def __len__(self) -> int:
        return len(self._kwargs())

    def config(self, base: RunConfig | None = None) -> RunConfig:
        """The overrides applied to ``base`` (a RunConfig; default: the embedded demo)."""
        from dpgrpo.config.loading import apply_overrides, embedded_default, override_strings

        return apply_overrides(base or embedded_default(), override_strings(self.overrides))


Found = dict[str, Any]          # the TRL options read, by name
Out = dict[str, Any]            # dpgrpo overrides
Handler = Callable[[str, Any, Found, Out, list[str]], None]


def _to(key: str) -> Handler:
    def put(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
        out[key] = value
    return put


def _refuse(name: str, value: object, reason: str) -> ConfigError:
    return ConfigError(f"TRL option {name}={value!r} is refused: {reason}")


def _off(*disabled: object, reason: str) -> Handler:
    """An option dpgrpo accepts only at its 'off' values."""
    def check(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
        if value not in disabled:
            raise _refuse(name, value, reason)
    return check


def _loss_type(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    if value in LOSS_TYPES:
        out["train.loss_type"] = value
        return
    reason = REFUSED.get(("loss_type", value))
    if reason is not None:
        raise _refuse("loss_type", value, f"it cannot hold under prompt-level DP: {reason} "
                      "(from_trl_config(args, loss_type='prompt_token_mean'))")
    raise _refuse("loss_type", value, f"not implemented; dpgrpo offers {', '.join(LOSS_TYPES)}")


def _scale_rewards(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    mapped = {True: "group", False: "none"}.get(value, value)
    if mapped in ("group", "none"):
        out["train.scale_rewards"] = mapped
        return
    if mapped == "batch":
        raise _refuse("scale_rewards", value, "it cannot hold under prompt-level DP: "
                      f"{REFUSED[('scale_rewards', 'batch')]}")
    raise _refuse("scale_rewards", value, "not implemented; dpgrpo offers 'group' and 'none'")


def _inert(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    label = "delta (TRL's two-sided ratio bound, not privacy.delta)" if name == "delta" else name
    if value is not None:
        notes.append(f"{label}={value!r} accepted, without effect: {ON_POLICY}")


def _single_pass(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    if value not in (None, 1):
        raise _refuse("num_iterations", value, REUSE)


def _steps_per_generation(
    name: str, value: object, found: Found, out: Out, notes: list[str]
) -> None:
    accumulation = found.get("gradient_accumulation_steps", 1) or 1
    if value not in (None, accumulation):
        raise _refuse("steps_per_generation", value, f"(gradient_accumulation_steps = "
                      f"{accumulation}): {REUSE}")


def _max_steps(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    if value is not None and value > 0:
        out["train.rounds"] = int(value)
    else:
        notes.append(f"max_steps={value!r}: dpgrpo counts rounds T, not epochs; train.rounds "
                     "keeps its value (set it in overrides)")


def _batch(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    """TRL's per_device_train_batch_size counts completions: prompts per step = it times
    gradient_accumulation_steps over num_generations (one process)."""
    g = found.get("num_generations")
    if g is None:
        raise ConfigError("per_device_train_batch_size counts completions; give num_generations "
                          "too, so that prompts per step = batch x accumulation / G is defined")
    prompts = value * (found.get("gradient_accumulation_steps", 1) or 1) / g
    out["privacy.expected_batch"] = prompts
    notes.append(f"per_device_train_batch_size={value} (x gradient_accumulation_steps / G): "
                 f"privacy.expected_batch = {prompts:g}, the expected prompts per round of "
                 "Poisson sampling (q = m / n), on one process")


def _temperature(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    """TRL divides the logits by its sampling temperature in the loss as well (the policy in
    the loss is the one the completions came from): train.tempered_logprobs does the same."""
    out["train.temperature"] = value
    out["train.tempered_logprobs"] = True


def _global_clip(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    """TRL clips no prompt's gradient, only the norm of the batch's mean: the non-private arm
    then clips no prompt either, and every arm clips its round's update to the same norm
    (train.max_update_norm; in the private arms that is the noisy mean, post-processing)."""
    out["train.clip_nonprivate"] = False
    if value is not None and value > 0:           # TRL (HF Trainer): None or 0 clips nothing
        out["train.max_update_norm"] = float(value)
    notes.append(f"max_grad_norm={value!r}: TRL clips the norm of the batch's mean gradient; "
                 "dpgrpo clips each prompt's gradient at privacy.clip_norm in the private arms "
                 "(the mechanism) and, like TRL, no prompt's in the non-private arm "
                 "(train.clip_nonprivate = false); the round's update is clipped to "
                 f"train.max_update_norm = {value!r} in every arm (after the noise in the "
                 "private arms: post-processing, no privacy cost)")


def _reward_weights(name: str, value: Any, found: Found, out: Out, notes: list[str]) -> None:
    out["reward_weights"] = None if value is None else tuple(float(w) for w in value)


def _log_completions(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    if value:
        raise _refuse("log_completions", value, "completions are generated from private prompts "
                      "and are not outputs the guarantee covers (paper, Section IV (v)); dpgrpo "
                      "writes none to any log or tracker, and has no opt-in that would")


def _seed(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    notes.append(f"seed={value!r} not used: dpgrpo draws its coins from OS entropy; "
                 "privacy.seed exists for debugging and makes a run unreleasable")


def _use_vllm(name: str, value: object, found: Found, out: Out, notes: list[str]) -> None:
    if value:
        out["train.rollout_engine"] = "vllm"


SAMPLER = ("dpgrpo's sampler (exact inverse-CDF draws from each prompt's own coins, the same in "
           "the transformers and vLLM engines) implements temperature, top_p and "
           "repetition_penalty only")

#: TRL option -> what from_trl_config does with it: handler(name, value, found, out, notes)
OPTIONS: dict[str, Handler] = {
    "num_generations": _to("train.group_size"),
    "max_completion_length": _to("train.max_new_tokens"),
    "beta": _to("train.beta"),
    "temperature": _temperature,
    "top_p": _to("train.top_p"),
    "repetition_penalty": _to("train.repetition_penalty"),
    "top_k": _off(None, 0, -1, reason=SAMPLER),
    "min_p": _off(None, 0, 0.0, reason=SAMPLER),
    "learning_rate": _to("train.learning_rate"),
    "max_grad_norm": _global_clip,
    "reward_weights": _reward_weights,
    "scale_rewards": _scale_rewards,
    "loss_type": _loss_type,
    "epsilon": _inert,
    "epsilon_high": _inert,
    "delta": _inert,
    "num_iterations": _single_pass,
    "gradient_accumulation_steps": lambda *_: None,   # read by the batch and steps rules
    "steps_per_generation": _steps_per_generation,
    "mask_truncated_completions": _to("train.mask_truncated_completions"),
    "use_bias_correction_kl": _to("train.kl_bias_correction"),
    "log_completions": _log_completions,
    "max_steps": _max_steps,
    "per_device_train_batch_size": _batch,
    "use_vllm": _use_vllm,
    "seed": _seed,
}


def _read(args: object, changes: Mapping[str, object]) -> Found:
    if isinstance(args, Mapping):
        unknown = sorted(set(args) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"TRL options {unknown} are not mapped by dpgrpo (known: "
                              f"{', '.join(OPTIONS)}); docs/coming-from-trl.md")
        found = dict(args)
    else:
        found = {name: v for name in OPTIONS
                 if (v := getattr(args, name, _UNSET)) is not _UNSET}
    unknown = sorted(set(changes) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown TRL options {unknown} (known: {', '.join(OPTIONS)})")
    return {**found, **changes}


def from_trl_config(args: object = None, *, overrides: Mapping[str, object] | None = None,
                    **changes: object) -> TRLSettings:
    """Map a TRL ``GRPOConfig`` (or a dict of its options) onto dpgrpo's configuration.

    ``changes``: TRL-named options that replace those of ``args`` (``loss_type="dr_grpo"``).
    ``overrides``: dpgrpo overrides applied after the mapped ones (``{"train.rounds": 12}``).
    Returns :class:`TRLSettings`, to pass as ``dpgrpo.train(..., **settings)``. Raises
    ConfigError, with the reason, for an option that cannot hold under prompt-level DP or that
    dpgrpo does not implement (module docstring; docs/coming-from-trl.md).
    """
    found = _read({} if args is None else args, changes)
    out: Out = {}
    notes: list[str] = []
    for name, value in found.items():
        OPTIONS[name](name, value, found, out, notes)
    weights = out.pop("reward_weights", None)
    for note in notes:
        log.info("from_trl_config: %s", note)
    return TRLSettings({**out, **dict(overrides or {})}, weights, tuple(notes))


__all__ = ["OPTIONS", "TRLSettings", "from_trl_config"]
