"""dpgrpo.objectives"""
