"""Moved to :mod:`dpgrpo.verify.fixtures`; this name stays while branches that import it merge."""

from dpgrpo.verify.fixtures import (CHATML_TEMPLATE, build_tiny_model, build_tiny_tokenizer,
                                    exact_rmsnorm, random_specs, rollouts_from_specs,
                                    save_tiny_model, synthetic_rollouts, tiny_fp32_policy,
                                    tiny_fp64_policy)

__all__ = ["CHATML_TEMPLATE", "build_tiny_model", "build_tiny_tokenizer", "exact_rmsnorm",
           "random_specs", "rollouts_from_specs", "save_tiny_model", "synthetic_rollouts",
           "tiny_fp32_policy", "tiny_fp64_policy"]
