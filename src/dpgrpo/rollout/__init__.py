"""Rollouts: G completions per prompt (Algorithm 1, line 4)."""

from dpgrpo.rollout.generate import RolloutBatch, generate

__all__ = ["RolloutBatch", "generate"]
