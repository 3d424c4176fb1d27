"""dpgrpo.audit"""
