"""dpgrpo.reports"""
