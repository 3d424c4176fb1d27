"""One accountant entry point (issue 59): ``epsilon(events, delta, relation=, group=)`` and its
inverse ``sigma``; the names they replace give the same numbers and warn."""

from __future__ import annotations

import math
import warnings

import pytest

import dpgrpo.privacy as privacy
from dpgrpo.privacy import accounting, calibration
from dpgrpo.privacy.accounting import (
    ADD_OR_REMOVE,
    REPLACE,
    PrivacyLedger,
    RoundEvent,
    epsilon,
    epsilon_report,
    generic_conversion,
)
from dpgrpo.privacy.neighbours import converted_figure, neighbour_figure

EVENTS = [RoundEvent(0.02, 1.0, 30)]
DELTA = 1e-5


def test_the_package_exports_one_accountant_family():
    accountant = {"epsilon", "sigma", "calibrate", "epsilon_report", "generic_conversion",
                  "default_delta", "EpsilonReport", "Calibration", "PrivacyLedger", "RoundEvent",
                  "ADD_OR_REMOVE", "REPLACE"}
    assert accountant <= set(privacy.__all__)
    for old in ("compute_epsilon", "pld_epsilon", "rdp_epsilon", "replace_one", "group_privacy",
                "calibrate_sigma", "group_epsilon", "replace_one_epsilon", "planning_sigma"):
        assert old not in privacy.__all__
    with pytest.warns(DeprecationWarning, match="use dpgrpo.privacy.epsilon"):
        assert privacy.pld_epsilon is accounting.pld_epsilon


def test_relations_are_parameters_of_one_function_with_real_numbers():
    one = epsilon(EVENTS, DELTA)
    # q = 0.02, sigma = 1, T = 30 at 1e-5, as pld_epsilon, replace_one_epsilon, group_epsilon
    # and neighbour_figure computed them before issue 59
    assert one == pytest.approx(0.9942019953269632, rel=1e-12)
    assert epsilon(PrivacyLedger(list(EVENTS)), DELTA) == one == PrivacyLedger(
        list(EVENTS)).epsilon(DELTA)
    swap = epsilon(EVENTS, DELTA, relation=REPLACE)
    two = epsilon(EVENTS, DELTA, group=2)
    swap_two = epsilon(EVENTS, DELTA, relation=REPLACE, group=2)
    assert (swap, two, swap_two) == pytest.approx((1.1450222508089465, 2.095944699243779, 5.19),
                                                  rel=1e-12)
    # replace-one is tighter than Corollary 1's 2 eps
    assert one < swap < 2 * one
    assert one < two < swap_two
    assert epsilon([RoundEvent(0.02, 0.0, 1)], DELTA, group=3) == math.inf
    assert epsilon([], DELTA, relation=REPLACE) == 0.0
    for bad in ({"relation": "replace-all"}, {"group": 0}, {"group": True}):
        with pytest.raises(accounting.PrivacyBudgetError):
            epsilon(EVENTS, DELTA, **bad)


def test_the_relation_reaches_the_accountant(monkeypatch):
    """A dispatch that ignored ``relation`` (every relation accounted as add-or-remove) is
    caught: the swap's figure would equal the headline epsilon."""
    assert epsilon(EVENTS, DELTA, relation=REPLACE) != epsilon(EVENTS, DELTA)
    real = accounting._accountant_epsilon.__wrapped__
    monkeypatch.setattr(accounting, "_accountant_epsilon",
                        lambda rounds, delta, k, relation, vdi: real(rounds, delta, k,
                                                                     ADD_OR_REMOVE, vdi))
    assert epsilon(EVENTS, DELTA, relation=REPLACE) == pytest.approx(epsilon(EVENTS, DELTA),
                                                                      rel=1e-6)


def test_the_old_names_give_the_same_numbers_and_warn():
    with pytest.warns(DeprecationWarning):
        assert accounting.pld_epsilon(EVENTS, DELTA) == epsilon(EVENTS, DELTA)
    with pytest.warns(DeprecationWarning):
        assert accounting.replace_one_epsilon(EVENTS, DELTA) == epsilon(EVENTS, DELTA,
                                                                        relation=REPLACE)
    with pytest.warns(DeprecationWarning):
        assert accounting.group_epsilon(EVENTS, DELTA, 3) == epsilon(EVENTS, DELTA, group=3)
    with pytest.warns(DeprecationWarning):
        assert accounting.rdp_epsilon(EVENTS, DELTA) == PrivacyLedger(
            list(EVENTS)).rdp_epsilon(DELTA)
    with pytest.warns(DeprecationWarning):
        assert accounting.compute_epsilon(1000, 20, 30, 1.0) == epsilon_report(1000, 20, 30, 1.0)
    with pytest.warns(DeprecationWarning):
        assert accounting.replace_one(1.0, 1e-6) == generic_conversion(1.0, 1e-6, relation=REPLACE)
    with pytest.warns(DeprecationWarning):
        assert accounting.group_privacy(1.0, 1e-6, 3) == generic_conversion(1.0, 1e-6, group=3)
    assert generic_conversion(1.0, 1e-6, relation=REPLACE) == (2.0, (1 + math.e) * 1e-6)
    assert generic_conversion(1.0, 1e-6, group=3) == (3.0, 3 * math.exp(2.0) * 1e-6)
    assert set(accounting.DEPRECATED) == {"compute_epsilon", "pld_epsilon", "rdp_epsilon",
                                          "replace_one_epsilon", "group_epsilon", "replace_one",
                                          "group_privacy"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)   # the new names never warn
        epsilon(EVENTS, DELTA, group=2)
        epsilon_report(1000, 20, 30, 1.0)
        neighbour_figure(EVENTS, DELTA, REPLACE, 2)
        converted_figure(1.0, 1e-6, REPLACE, 2)


def test_sigma_is_the_inverse(monkeypatch):
    calls = []
    monkeypatch.setattr(calibration, "calibrate",
                        lambda *args: calls.append(args) or type("C", (), {"sigma": 0.9})())
    monkeypatch.setattr(calibration, "planning_sigma", lambda *args: 0.95)
    assert calibration.sigma(1000, 20, 30, 1.0) == 0.9
    assert calibration.sigma(1000, 20, 30, 1.0, quick=True) == 0.95
    with pytest.warns(DeprecationWarning):
        assert calibration.calibrate_sigma(1000, 20, 30, 1.0, 1e-5) == 0.9
    assert calls == [(1000, 20, 30, 1.0, None), (1000, 20, 30, 1.0, 1e-5)]
