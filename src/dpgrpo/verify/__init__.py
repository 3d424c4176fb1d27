"""Mechanism-verification suite behind ``dpgrpo verify`` (paper, Appendix B).

Each check measures one implementation invariant the privacy analysis relies on and compares it
with a tolerance; the record is machine-readable (check, measured, tolerance, passed).

* :mod:`~dpgrpo.verify.registry`: :class:`Check`, :class:`CheckResult`, the :func:`check`
  decorator and the list :data:`CHECKS`;
* :mod:`~dpgrpo.verify.mechanism`: model-free checks of the sampler, the mechanism, the noise
  source and the accountant (``group="mechanism"``), registered on import;
* :mod:`~dpgrpo.verify.randomness`: the privacy randomness itself (noise blocks and pairs,
  coin resolution, record streams' secret bits and binding), ``group="mechanism"``;
* :mod:`~dpgrpo.verify.model`: per-prompt gradient checks on a tiny random double-precision
  model (``group="model"``), registered by :func:`run_checks` (they load transformers);
* :mod:`~dpgrpo.verify.fixtures`: the tiny random Llama and offline tokenizer they use (also
  used by the tests and the benchmarks).
"""

from __future__ import annotations

from dpgrpo.verify import mechanism, randomness  # noqa: F401  (registers the checks)
from dpgrpo.verify.registry import CHECKS, Check, CheckResult, check


def run_checks(groups: tuple[str, ...] = ("mechanism", "model")) -> list[CheckResult]:
    """Run every registered check in ``groups`` and return the records."""
    _register_model_checks()
    mechanism.reset()
    return [c.run() for c in CHECKS if c.group in groups]


def _register_model_checks() -> None:
    """Import :mod:`dpgrpo.verify.model`, which registers the model checks."""
    from dpgrpo.verify import model  # noqa: F401


__all__ = ["CHECKS", "Check", "CheckResult", "check", "run_checks"]
