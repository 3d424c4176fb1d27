"""Evaluation: greedy decoding, one completion per problem, scored by a task's scorers.

``evaluate`` runs a model (base or a release) over an eval split and writes predictions,
resumably; ``predictions`` reads and rescores them; ``stats`` holds the paper's statistics
(paired problem-cluster bootstrap, exact McNemar with Holm, MDE); ``defaults`` the eval settings.
"""
