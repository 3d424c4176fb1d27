"""Experiments built from training runs: the paper's protocol (arms x seeds, compared on one
eval set), the CPU study (protocol + audits + results page) and public-proxy tuning."""
