"""dpgrpo.tasks"""
