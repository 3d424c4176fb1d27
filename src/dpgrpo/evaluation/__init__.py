"""dpgrpo.evaluation"""
