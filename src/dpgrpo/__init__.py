"""dpgrpo: reinforcement learning with verifiable rewards under prompt-level differential privacy.

The package implements DP-GRPO (Algorithm 1 of "Reward-Driven Learning under Prompt-Level
Differential Privacy"): Poisson-sampled prompts, G verified completions per prompt, one clipped
gradient per prompt, Gaussian noise once per round, and PLD accounting.
"""

__version__ = "0.1.0"

from dpgrpo.errors import (  # noqa: E402
    ConfigError,
    DataError,
    DPGRPOError,
    PrivacyBudgetError,
    PrivacyError,
    ReleaseError,
)

__all__ = [
    "__version__",
    "ConfigError",
    "DataError",
    "DPGRPOError",
    "PrivacyBudgetError",
    "PrivacyError",
    "ReleaseError",
]
