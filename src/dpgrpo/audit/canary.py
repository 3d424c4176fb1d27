"""Canaries for the one-run audit: their score (step 4 of the canary protocol).

The protocol is Steinke, Nasr and Jagielski (2023), as the DP-GRPO paper's Appendix B "Canary
diagnostic" uses it. Steps 1-3 (the canaries' content, their secret inclusion bits and the saved
:class:`CanaryPlan`) are the trainer's, in :mod:`dpgrpo.training.canaries` (below this layer);
their names are re-exported here. Step 4: after training, each canary is scored from the release
alone with the attack's signal (:func:`canary_signal`), and :mod:`dpgrpo.audit.one_run` turns
the guesses into an empirical epsilon lower bound, printed beside the certified epsilon.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpgrpo.errors import ConfigError
from dpgrpo.training.canaries import (
    CANARY_PLAN_VERSION,
    CanaryPlan,
    draw_inclusion,
    make_canaries,
)

#: Signals a canary can be scored with; each is computed from the release alone.
SIGNALS: tuple[str, ...] = ("gain+likelihood", "score_gain", "likelihood_ratio", "k3_divergence",
                            "zlib_likelihood_ratio")


def canary_signal(features: np.ndarray, names: Sequence[str],
                  signal: str = "gain+likelihood") -> np.ndarray:
    """One membership score per canary from its DIBA features (higher: more likely included).

    ``"gain+likelihood"`` ranks by the reward gain (fine-tuned minus base mean reward, DIBA's
    advantage signal) and breaks its many ties by the likelihood ratio (DIBA's logit-side
    signal); the score is the rank. Any single DIBA feature can be used instead. The signal uses
    no inclusion bit, as the one-run theorem requires; NaN counts as the lowest score.
    """
    x = np.asarray(features, dtype=np.float64)
    cols = list(names)
    if signal not in SIGNALS:
        raise ConfigError(f"unknown signal {signal!r}; known: {', '.join(SIGNALS)}")
    if signal != "gain+likelihood":
        return np.nan_to_num(x[:, cols.index(signal)], nan=-np.inf)
    gain = np.nan_to_num(x[:, cols.index("score_gain")], nan=-np.inf)
    ratio = np.nan_to_num(x[:, cols.index("likelihood_ratio")], nan=-np.inf)
    order = np.lexsort((ratio, gain))                   # ascending; gain is the primary key
    ranks = np.empty(x.shape[0])
    ranks[order] = np.arange(x.shape[0], dtype=np.float64)
    return ranks


__all__ = ["CANARY_PLAN_VERSION", "SIGNALS", "CanaryPlan", "canary_signal", "draw_inclusion",
           "make_canaries"]
