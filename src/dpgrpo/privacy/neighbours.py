"""What a release guarantees beyond one added or removed prompt, labelled by how it was obtained.

The certificate's epsilon protects one prompt added or removed (Definition 3). The same ledger
also protects one prompt swapped for another (replace-one) and a person who contributes k
prompts (a group of k added or removed together). Each :class:`NeighbourFigure` is accounted at
the run's delta_pld and names its method; in the certificate its ``delta`` also carries the
noise generator's tail term at that figure's epsilon, ``(1 + e^eps) * eta``, exactly as the
headline delta does (:func:`dpgrpo.privacy.noise.noise_tail_delta`): the coupling between the
truncated generator and exact Gaussian noise holds for any pair of neighbours, so it adds to
every relation's delta (issue 32, defect 6). Under contributor-level DP (``data.privacy_unit =
"contributor"``) the record is a contributor, so read "prompt" below as "contributor": the
group figures then count contributors, and the certificate's ``unit`` says which applies.

* ``pld-accountant``: the ledger accounted directly under that relation
  (:func:`dpgrpo.privacy.accounting.epsilon` with ``relation`` and ``group``);
* ``generic-conversion``: Corollary 1 (replace-one) or Proposition 1 (groups) applied where the
  accountant cannot: k > 1 prompts swapped (Corollary 1 on the accountant's group-k curve, at
  the same delta), or an (epsilon, delta) pair with no ledger (:func:`converted_figure`, the
  paper's conversions, which at useful budgets can exceed delta = 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy.accounting import (
    DEFAULT_DISCRETIZATION,
    RELATIONS,
    RoundEvent,
    check_relation,
    epsilon,
    generic_conversion,
)
from dpgrpo.privacy.group import ADD_OR_REMOVE, REPLACE

METHOD_ACCOUNTANT = "pld-accountant"
METHOD_GENERIC = "generic-conversion"


@dataclass(frozen=True)
class NeighbourFigure:
    """(epsilon, delta)-DP for ``relation`` applied to ``group`` prompts at once; ``method`` says
    how it was obtained and ``basis`` names the PLD or the conversion used."""

    epsilon: float
    delta: float
    relation: str
    group: int
    method: str
    basis: str
    delta_pld: float | None = None   # what the accountant was asked for (None: delta itself)
    noise_tail_delta: float = 0.0    # the generator's tail term included in delta

    def with_tail(self, tail: float) -> NeighbourFigure:
        """This figure with the noise-tail term ``tail`` added to its delta."""
        if not tail >= 0.0:
            raise PrivacyBudgetError(f"the noise-tail term must be >= 0, got {tail}")
        return replace(self, delta=self.delta + tail, delta_pld=self.delta,
                       noise_tail_delta=tail)

    @property
    def meaningful(self) -> bool:
        return math.isfinite(self.epsilon) and self.delta < 1.0

    def to_dict(self) -> dict[str, float | int | str | bool]:
        return {**asdict(self), "meaningful": self.meaningful}


def neighbour_figure(events: Sequence[RoundEvent], delta: float, relation: str = ADD_OR_REMOVE,
                     group: int = 1, *, value_discretization_interval: float =
                     DEFAULT_DISCRETIZATION) -> NeighbourFigure:
    """The ledger's guarantee at ``delta`` for ``relation`` applied to ``group`` prompts: from the
    accountant wherever dp_accounting can account it, else Corollary 1 on its group curve."""
    check_relation(relation, group)
    k = int(group)
    eps = epsilon(events, delta, relation=relation, group=k,
                  value_discretization_interval=value_discretization_interval)
    if relation == ADD_OR_REMOVE:
        basis = "mixture-of-Gaussians PLD (Binomial(k, q))" if k > 1 else "subsampled-Gaussian PLD"
        return NeighbourFigure(eps, delta, relation, k, METHOD_ACCOUNTANT, basis)
    if k == 1:
        return NeighbourFigure(eps, delta, relation, 1, METHOD_ACCOUNTANT,
                               "subsampled-Gaussian PLD, REPLACE_ONE")
    return NeighbourFigure(eps, delta, relation, k, METHOD_GENERIC,
                           f"Corollary 1 (remove {k}, add {k}) on the accountant's group-{k} curve")


def converted_figure(epsilon: float, delta: float, relation: str = ADD_OR_REMOVE,
                     group: int = 1) -> NeighbourFigure:
    """Generic conversion of an add-or-remove-one (epsilon, delta) pair when no ledger is known:
    Proposition 1 for the group, then Corollary 1 for a swap. Loose: delta may exceed 1."""
    check_relation(relation, group)
    if not (epsilon >= 0.0 and math.isfinite(epsilon)):
        raise PrivacyBudgetError(f"epsilon must be finite and >= 0, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise PrivacyBudgetError(f"delta must lie in (0, 1), got {delta}")
    eps, dlt = generic_conversion(epsilon, delta, relation=relation, group=int(group))
    applied = [*(["Proposition 1"] if group > 1 else []),
               *(["Corollary 1"] if relation == REPLACE else [])]
    basis = " then ".join(applied or ["none"]) + f" on ({epsilon:g}, {delta:g})"
    return NeighbourFigure(eps, dlt, relation, int(group), METHOD_GENERIC, basis)


def neighbour_figures(events: Sequence[RoundEvent], delta: float,
                      group_sizes: Sequence[int] = (2, 3), *,
                      tail: Callable[[float], float] | None = None) -> dict[str, object]:
    """The certificate's extra figures: replace-one, then each group size, accounted at
    ``delta`` (the run's delta_pld); ``tail(epsilon)`` is the noise generator's tail term at a
    figure's epsilon, added to that figure's delta as to the headline delta (None: no term)."""
    figures = [neighbour_figure(events, delta, REPLACE),
               *(neighbour_figure(events, delta, ADD_OR_REMOVE, k) for k in group_sizes)]
    if tail is not None:
        figures = [f.with_tail(tail(f.epsilon)) for f in figures]
    return {"replace_one": figures[0].to_dict(),
            "group_privacy": [f.to_dict() for f in figures[1:]]}


__all__ = [
    "METHOD_ACCOUNTANT",
    "METHOD_GENERIC",
    "RELATIONS",
    "NeighbourFigure",
    "converted_figure",
    "neighbour_figure",
    "neighbour_figures",
]
