"""Replace-one and group accounting (privacy/group.py, privacy/neighbours.py): the vectorized
mixture PLD is dp_accounting's, figures are labelled, the certificate and release card state
them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy import group
from dpgrpo.privacy.accounting import (
    PrivacyLedger,
    RoundEvent,
    group_epsilon,
    pld_epsilon,
    replace_one_epsilon,
)
from dpgrpo.privacy.neighbours import converted_figure, neighbour_figure, neighbour_figures


def _pmfs(pld):
    return [(p._lower_loss, p._infinity_mass, p._probs) for p in (pld._pmf_remove, pld._pmf_add)]


def test_binomial_mixture():
    sens, probs = group.binomial_mixture(3, 0.1)
    assert sens == [0.0, 1.0, 2.0, 3.0]
    assert probs == pytest.approx([0.729, 0.243, 0.027, 0.001], abs=1e-15)
    assert group.binomial_mixture(1, 0.3)[1] == pytest.approx([0.7, 0.3])
    with pytest.raises(PrivacyBudgetError):
        group.binomial_mixture(0, 0.1)


@pytest.mark.parametrize("q,sigma,k", [(0.2, 2.0, 2), (0.05, 1.5, 3)])
def test_vectorized_mixture_pld_is_dp_accountings_bit_for_bit(q, sigma, k):
    sens, probs = group.binomial_mixture(k, q)
    library = pld_lib.from_mixture_gaussian_mechanism(sigma, sens, probs,
                                                      value_discretization_interval=1e-3)
    ours = group._mixture_pld(sigma, k, q, 1e-3)
    for (lo_a, inf_a, p_a), (lo_b, inf_b, p_b) in zip(_pmfs(library), _pmfs(ours)):
        assert lo_a == lo_b and inf_a == inf_b and np.array_equal(p_a, p_b)


def test_group_and_replace_equal_pld_accountant_on_dp_events():
    events = [RoundEvent(0.2, 2.0, 3), RoundEvent(0.3, 2.5, 2)]
    vdi, delta = 1e-3, 1e-5
    for k in (1, 2):
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=vdi)
        for e in events:
            acc.compose(group.mixture_event(e.noise_multiplier, k, e.sampling_rate), e.count)
        assert group_epsilon(events, delta, k, value_discretization_interval=vdi) == \
            acc.get_epsilon(delta)
    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, vdi)
    for e in events:
        acc.compose(e.dp_event())
    assert replace_one_epsilon(events, delta, value_discretization_interval=vdi) == \
        acc.get_epsilon(delta)
    assert isinstance(group.mixture_event(1.0, 2, 0.1), dp_event.MixtureOfGaussiansDpEvent)


def test_round_plds_are_cached_across_checkpoints():
    group.round_pld.cache_clear()
    for rounds in (4, 8, 12):  # a growing ledger: the same round, recomposed
        group_epsilon([RoundEvent(0.15, 1.7, rounds)], 1e-5, 2, value_discretization_interval=1e-3)
    info = group.round_pld.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_figures_are_labelled():
    events, delta = [RoundEvent(0.02, 1.0, 30)], 1e-5
    replace = neighbour_figure(events, delta, "replace-one")
    assert (replace.relation, replace.group, replace.method) == ("replace-one", 1, "pld-accountant")
    assert replace.delta == delta and replace.epsilon == replace_one_epsilon(events, delta)
    two = neighbour_figure(events, delta, "add-or-remove-one", 2)
    assert two.method == "pld-accountant" and two.epsilon == group_epsilon(events, delta, 2)
    one = neighbour_figure(events, delta)
    assert one.epsilon == pytest.approx(pld_epsilon(events, delta), abs=1e-6)
    # k swapped prompts: no accountant event; Corollary 1 on the group-k curve, at the same delta.
    swap = neighbour_figure(events, delta, "replace-one", 2)
    assert swap.method == "generic-conversion" and swap.delta == delta and swap.meaningful
    e1 = group_epsilon(events, delta / 2, 2)  # one feasible split: delta/2 + e^e1 (delta/2) e^-e1
    e2 = group_epsilon(events, delta / 2 * math.exp(-e1), 2)
    assert two.epsilon < swap.epsilon <= e1 + e2 + 0.02  # the 0.01 grid rounds each part up
    for bad in (dict(relation="replace-all"), dict(group=0)):
        with pytest.raises(PrivacyBudgetError):
            neighbour_figure(events, delta, **bad)


def test_swap_chain_is_valid_and_no_better_than_the_accountant():
    from dpgrpo.privacy import accounting as figures  # Corollary 1 on the group curve

    events, delta = [RoundEvent(0.02, 1.0, 30)], 1e-5
    chained = figures._replace_group_epsilon(events, delta, 1, 1e-4)  # the generic route, k = 1
    assert chained >= replace_one_epsilon(events, delta)  # the accountant is tighter
    pld = group.composed_pld(((0.02, 1.0, 30),), 2, "add-or-remove-one", 1e-4)
    eps = figures._replace_group_epsilon(events, delta, 2, 1e-4)
    first = np.arange(0.0, eps, 0.01)
    second = (eps - first)[::-1]  # ascending, as dp_accounting wants it
    cost = (pld.get_delta_for_epsilon(first)
            + np.exp(first) * pld.get_delta_for_epsilon(second)[::-1])
    assert cost.min() <= delta  # some split (e1, eps - e1) of the reported figure meets delta


def test_generic_conversion_keeps_the_old_figures():
    fig = converted_figure(8.0, 1e-5, "add-or-remove-one", 3)
    assert fig.epsilon == 24.0 and fig.delta == pytest.approx(266.58, abs=0.01)
    assert fig.method == "generic-conversion" and not fig.meaningful
    fig = converted_figure(8.0, 1e-4, "replace-one")
    assert (fig.epsilon, round(fig.delta, 3)) == (16.0, 0.298)
    with pytest.raises(PrivacyBudgetError):
        converted_figure(math.inf, 1e-5)


def _run(cfg, ledger):
    return SimpleNamespace(config=cfg, delta=1e-5, q=0.02, sigma=1.0, clip_norm=0.05, n=1000,
                           expected_batch=20.0, seeded=False, num_canaries=0,
                           coordinates=1000, n_source="data.n_slots",
                           noise=SimpleNamespace(releasable=True, secure=True),
                           sampler=SimpleNamespace(releasable=True),
                           coins=SimpleNamespace(releasable=True), init_adapter_sha256=None)


def test_certificate_and_release_card_state_the_figures():
    from dpgrpo.release.certificate import certificate
    from dpgrpo.release.write import _release_readme

    ledger = PrivacyLedger([RoundEvent(0.02, 1.0, 30)])
    cfg = apply_overrides(embedded_default(), ["privacy.group_sizes=2,4"])
    cert = certificate(_run(cfg, ledger), ledger, 30)
    assert cert["replace_one"]["method"] == "pld-accountant"
    assert cert["replace_one"]["epsilon"] == replace_one_epsilon(ledger.events, 1e-5)
    assert [g["group"] for g in cert["group_privacy"]] == [2, 4]
    assert all(g["delta"] == 1e-5 and g["method"] == "pld-accountant"
               for g in cert["group_privacy"])
    assert cert["group_privacy"][1]["epsilon"] == group_epsilon(ledger.events, 1e-5, 4)
    assert "group_privacy_k2" not in cert
    card = _release_readme(cert)
    assert "one problem swapped for another" in card and "k = 4:" in card
    from dpgrpo.release.check import format_epsilon  # the card rounds; the JSON not

    assert f"k = 2: ({format_epsilon(cert['group_privacy'][0]['epsilon'])}, " in card
    none = certificate(_run(apply_overrides(cfg, ["privacy.group_sizes="]), ledger), ledger, 30)
    assert none["group_privacy"] == [] and "replace_one" in none
    assert neighbour_figures(ledger.events, 1e-5, ())["group_privacy"] == []


def test_figures_carry_the_noise_tail_term_like_the_headline(monkeypatch):
    """Issue 32, defect 6: replace-one and group figures were stated at delta_pld alone."""
    from dpgrpo.release.certificate import certificate

    seen = []

    def tail(d, rounds, eps):  # large enough to see in floating point; grows with epsilon
        seen.append(eps)
        return 1e-7 * rounds * (1.0 + math.exp(min(eps, 50.0))) / 1e3

    monkeypatch.setattr("dpgrpo.release.certificate.noise_tail_delta", tail)
    ledger = PrivacyLedger([RoundEvent(0.02, 1.0, 30)])
    cfg = apply_overrides(embedded_default(), ["privacy.group_sizes=2,4"])
    cert = certificate(_run(cfg, ledger), ledger, 30)
    assert cert["delta"] == 1e-5 + tail(1000, 30, cert["epsilon"])
    for fig in (cert["replace_one"], *cert["group_privacy"]):
        term = tail(1000, 30, fig["epsilon"])  # at the figure's own epsilon, T = 30 rounds
        assert term > 1e-9 and fig["noise_tail_delta"] == term
        assert fig["delta"] == 1e-5 + term and fig["delta_pld"] == 1e-5
        assert fig["delta"] > cert["delta_pld"]
    # a group figure's epsilon is larger, so its tail term is too
    figures = cert["group_privacy"]
    assert figures[1]["noise_tail_delta"] > figures[0]["noise_tail_delta"]
    assert neighbour_figure(ledger.events, 1e-5).with_tail(0.0).delta == 1e-5
