"""One round's privacy loss distribution beyond one added or removed prompt.

Two neighbouring relations besides the certificate's add-or-remove-one (Definition 3):

* **replace-one** (one prompt swapped for another): ``dp_accounting`` builds the PLD of the
  Poisson-subsampled Gaussian under ``NeighboringRelation.REPLACE_ONE`` directly, tighter than
  Corollary 1's (2 eps, (1 + e^eps) delta).
* **a group of k prompts added or removed together** (one person's k problems): under Poisson
  sampling each of the k records enters a round independently with probability q, so the sum
  moves by at most j C with j ~ Binomial(k, q), and the round is dominated by the scalar
  mixture-of-Gaussians pair N(0, sigma^2) vs sum_j Binom(j; k, q) N(j, sigma^2) (Ganesh 2024,
  "Tight group-level DP guarantees for DP-SGD with sampling via mixture of Gaussians
  mechanisms", arXiv:2401.10294; vector-to-scalar reduction: Choquette-Choo et al. 2023,
  arXiv:2310.15526, Corollary 4.7). That is ``dp_accounting``'s ``MixtureOfGaussiansDpEvent``;
  k = 1 is the subsampled Gaussian itself. Tighter than Proposition 1's
  (k eps, k e^((k-1) eps) delta).

``dp_accounting`` 0.6 inverts the mixture's privacy loss by a recursive Python bisection, one
call per tree node (about 15 s per direction for the bare demo's round on 2 CPU cores).
:class:`_VectorizedMixtureLoss` runs the very same bisection for all points at once (same
midpoints, same comparisons, same floats: the PMF is identical bit for bit, which a test checks
against the library), about 10x faster. Each round's PLD is cached, so a certificate rewritten
at every checkpoint only recomposes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from dp_accounting.privacy_accountant import NeighboringRelation

from dpgrpo.errors import PrivacyBudgetError

ADD_OR_REMOVE = "add-or-remove-one"
REPLACE = "replace-one"
Round = tuple[float, float, int]  # (q, sigma, count) of consecutive equal rounds


def binomial_mixture(k: int, q: float) -> tuple[list[float], list[float]]:
    """Sensitivities 0..k and their probabilities Binomial(k, q): how many of k records a round
    samples."""
    if int(k) != k or k < 1:
        raise PrivacyBudgetError(f"group size k must be a positive integer, got {k}")
    k = int(k)
    probs = [math.comb(k, j) * q ** j * (1.0 - q) ** (k - j) for j in range(k + 1)]
    return [float(j) for j in range(k + 1)], probs


def mixture_event(sigma: float, k: int, q: float) -> dp_event.MixtureOfGaussiansDpEvent:
    """One round for a group of k records as a ``dp_accounting`` event (sensitivity in units
    of C, noise std sigma)."""
    sensitivities, probs = binomial_mixture(k, q)
    return dp_event.MixtureOfGaussiansDpEvent(sigma, sensitivities, probs)


class _VectorizedMixtureLoss(plm.MixtureGaussianPrivacyLoss):
    """``MixtureGaussianPrivacyLoss`` whose inverse bisection runs over all points at once."""

    def _privacy_losses(self, x: np.ndarray) -> np.ndarray:
        # privacy_loss(x) for an array: the same terms folded left to right, as logaddexp.reduce.
        sign = 1.0 if self.adjacency_type == plm.AdjacencyType.ADD else -1.0
        terms = [
            const + sign * (sens * x / self._variance)
            for const, sens in zip(self._precompute_privacy_loss_constants, self.sensitivities)
        ]
        out: np.ndarray = functools.reduce(np.logaddexp, terms)
        return -out if sign > 0 else out

    def _inverse_privacy_losses_with_range(self, privacy_losses: np.ndarray,
                                           bounds: tuple[float, float],
                                           precision: float = 1e-6) -> np.ndarray:
        # Per point: the library's recursion (go right if loss < loss(mid), else left; stop
        # once the interval is at most `precision` wide; return floor(hi / precision) * precision).
        count = len(privacy_losses)
        lo = np.full(count, float(bounds[0]))
        hi = np.full(count, float(bounds[1]))
        active = hi - lo > precision
        while active.any():
            idx = np.flatnonzero(active)
            mid = (lo[idx] + hi[idx]) / 2
            right = privacy_losses[idx] < self._privacy_losses(mid)
            lo[idx[right]] = mid[right]
            hi[idx[~right]] = mid[~right]
            active[idx] = hi[idx] - lo[idx] > precision
        return np.floor(hi / precision) * precision


def _mixture_pld(sigma: float, k: int, q: float, vdi: float) -> pld_lib.PrivacyLossDistribution:
    """``pld_lib.from_mixture_gaussian_mechanism`` (connect-the-dots, pessimistic), vectorized."""
    sensitivities, probs = binomial_mixture(k, q)
    build = getattr(pld_lib, "_create_pld_pmf_from_monotone_privacy_loss", None)
    if build is None:  # a dp_accounting without the helper: its own (slower) constructor
        return pld_lib.from_mixture_gaussian_mechanism(
            sigma, sensitivities, probs, value_discretization_interval=vdi)

    def pmf(adjacency: plm.AdjacencyType) -> object:
        loss = _VectorizedMixtureLoss(sigma, sensitivities, probs, adjacency_type=adjacency)
        return build(loss, pessimistic_estimate=True, value_discretization_interval=vdi,
                     use_connect_dots=True)

    return pld_lib.PrivacyLossDistribution(pmf(plm.AdjacencyType.REMOVE),
                                           pmf(plm.AdjacencyType.ADD))


@functools.lru_cache(maxsize=8)
def round_pld(q: float, sigma: float, k: int, relation: str,
              vdi: float) -> pld_lib.PrivacyLossDistribution:
    """PLD of one private round (0 < q <= 1, sigma > 0) for a group of k records under
    ``relation``; replace-one is supported for k = 1 only. Cached per (q, sigma, k, relation)."""
    if relation == REPLACE and k == 1:
        return pld_lib.from_gaussian_mechanism(
            sigma, value_discretization_interval=vdi, sampling_prob=q,
            neighboring_relation=NeighboringRelation.REPLACE_ONE)
    if relation == ADD_OR_REMOVE:
        return _mixture_pld(sigma, k, q, vdi)
    raise PrivacyBudgetError(f"no accountant PLD for relation {relation!r} with group size {k}")


def composed_pld(rounds: Sequence[Round], k: int, relation: str,
                 vdi: float) -> pld_lib.PrivacyLossDistribution:
    """PLD of the composition of private rounds, composed as ``PLDAccountant`` composes events."""
    out = pld_lib.identity(value_discretization_interval=vdi)
    for q, sigma, count in rounds:
        out = out.compose(round_pld(q, sigma, k, relation, vdi).self_compose(count))
    return out


__all__ = ["ADD_OR_REMOVE", "REPLACE", "binomial_mixture", "composed_pld", "mixture_event",
           "round_pld"]
