"""dpgrpo.privacy"""
