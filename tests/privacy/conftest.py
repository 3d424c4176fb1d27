"""Fixtures shared by the privacy tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def eps_evaluations(monkeypatch) -> list[tuple[float, float]]:
    """Every (sigma, value_discretization_interval) the calibration's search evaluates, in
    order: a spy on ``calibration._eps_single`` that still calls it."""
    from dpgrpo.privacy import calibration

    seen: list[tuple[float, float]] = []
    original = calibration._eps_single

    def spy(q: float, sigma: float, rounds: int, delta: float, vdi: float) -> float:
        seen.append((sigma, vdi))
        return original(q, sigma, rounds, delta, vdi)

    monkeypatch.setattr(calibration, "_eps_single", spy)
    return seen
