"""dpgrpo.rollout"""
