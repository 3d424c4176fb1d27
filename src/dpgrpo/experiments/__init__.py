"""Experiments built from training runs: public-proxy tuning (more to come here)."""
