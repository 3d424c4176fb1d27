"""Training: one loop over rounds of Algorithm 1 and what it runs on.

``trainer`` is the loop; ``setup`` turns a config into a run (model, task, sampler, noise,
public constants); ``arms`` builds what each arm of :mod:`dpgrpo.config.arms` computes;
``grads`` the per-prompt gradients (one row per record, never mixed); ``distributed`` the
all-reduce across ranks; ``metrics``, ``runtime`` and ``quiet`` what the loop reports and how
it runs (threads, memory, silenced libraries).
"""
