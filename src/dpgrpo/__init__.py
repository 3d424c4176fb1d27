"""dpgrpo: reinforcement learning with verifiable rewards under prompt-level differential privacy.

The package implements DP-GRPO (Algorithm 1 of "Reward-Driven Learning under Prompt-Level
Differential Privacy"): Poisson-sampled prompts, G verified completions per prompt, one clipped
gradient per prompt, Gaussian noise once per round, and PLD accounting.

The top-level API (docs: :mod:`dpgrpo.api`)::

    from dpgrpo import train, evaluate, make_task, RunConfig, load_config

* :func:`train` runs Algorithm 1 on a config, a built-in task, or your own ``problems`` (a
  list of dicts or :class:`~dpgrpo.tasks.Problem`, or a ``datasets.Dataset``) with reward
  functions ``(completion, problem) -> float`` or TRL's, on a model name or a model object;
* :func:`evaluate` is ``dpgrpo eval``; :func:`make_task` builds a task from problems and rewards;
* :func:`check_release` is ``dpgrpo release check`` (files against the certificate's sha256,
  finite weights, epsilon recomputed: a :class:`ReleaseCheck`); :func:`load_release` applies a
  release to its base (offline for the alias ``smollm2-135m``);
* coming from TRL (docs/coming-from-trl.md): ``prompt``-column datasets, TRL reward functions
  (:func:`trl_reward`) and :func:`from_trl_config` for a ``GRPOConfig``'s options;
* :class:`RunConfig` and its sections (:class:`ModelConfig`, :class:`DataConfig`,
  :class:`PrivacyConfig`, :class:`TrainConfig`, :class:`AuditConfig`), :func:`load_config`,
  :func:`embedded_default`; :class:`TrainResult`; the errors.

Heavy modules (torch, transformers) load on first use, so ``import dpgrpo`` stays light.
"""

from __future__ import annotations

__version__ = "0.2.0"

TYPE_CHECKING = False  # not typing's: ``import dpgrpo`` imports nothing at all
if TYPE_CHECKING:  # for type checkers; at run time every name below loads on first use
    from typing import Any

    from dpgrpo.config import (
        AuditConfig,
        DataConfig,
        ModelConfig,
        PrivacyConfig,
        RunConfig,
        TrainConfig,
        embedded_default,
        load_config,
    )
    from dpgrpo.errors import (
        ConfigError,
        DataError,
        DPGRPOError,
        PrivacyBudgetError,
        PrivacyError,
        ReleaseError,
    )

#: name -> module of the objects loaded on first use (PEP 562). Nothing is imported by
#: ``import dpgrpo`` itself, so the ``dpgrpo`` command spends no time inside the package's
#: import before :func:`dpgrpo.__main__.main` can catch a Ctrl-C (one line, exit 130).
_LAZY = {"train": "dpgrpo.api", "evaluate": "dpgrpo.api", "prepare": "dpgrpo.api",
         "TrainResult": "dpgrpo.training.trainer", "make_task": "dpgrpo.tasks.custom",
         "RewardTask": "dpgrpo.tasks.custom", "Problem": "dpgrpo.tasks.base",
         "get_task": "dpgrpo.tasks", "push_release": "dpgrpo.release.publish",
         "from_trl_config": "dpgrpo.config.trl", "TRLSettings": "dpgrpo.config.trl",
         "trl_reward": "dpgrpo.tasks.trl_rewards", "check_release": "dpgrpo.release.check",
         "ReleaseCheck": "dpgrpo.release.check", "load_release": "dpgrpo.release.load",
         **dict.fromkeys(("AuditConfig", "DataConfig", "ModelConfig", "PrivacyConfig",
                          "RunConfig", "TrainConfig", "embedded_default", "load_config"),
                         "dpgrpo.config"),
         **dict.fromkeys(("ConfigError", "DataError", "DPGRPOError", "PrivacyBudgetError",
                          "PrivacyError", "ReleaseError"), "dpgrpo.errors")}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("__"):  # ``dpgrpo.config`` and the like,
        try:                                                # as the eager import set them
            return importlib.import_module(f"dpgrpo.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"dpgrpo.{name}":
                raise
    raise AttributeError(f"module 'dpgrpo' has no attribute {name!r}")


__all__ = [
    "AuditConfig",
    "ConfigError",
    "DPGRPOError",
    "DataConfig",
    "DataError",
    "ModelConfig",
    "PrivacyBudgetError",
    "PrivacyConfig",
    "PrivacyError",
    "Problem",
    "ReleaseCheck",
    "ReleaseError",
    "RewardTask",
    "RunConfig",
    "TRLSettings",
    "TrainConfig",
    "TrainResult",
    "__version__",
    "check_release",
    "embedded_default",
    "evaluate",
    "from_trl_config",
    "get_task",
    "load_config",
    "load_release",
    "make_task",
    "prepare",
    "push_release",
    "train",
    "trl_reward",
]
