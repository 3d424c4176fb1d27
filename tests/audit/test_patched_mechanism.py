"""Each bug of issue 58's table, made by patching the real mechanism or noise source, is
flagged by the white-box audit, and the report names the statistic; the correct mechanism
passes (the model-free audit at the operating point's q, T and sigma with 4,000 canaries)."""

from __future__ import annotations

import math
import os

import pytest

from dpgrpo.audit import whitebox
from dpgrpo.audit.mechanism_audit import audit_mechanism, require_passed
from dpgrpo.audit.whitebox import AuditSetup
from dpgrpo.errors import MechanismAuditError
from dpgrpo.privacy import mechanism, noise

#: the CPU study's q, T and sigma until 2026-12-07 (n 1,000, m 16, T 12, epsilon 8), 4,000 canaries
SETUP = AuditSetup(n=5000, q=0.016, rounds=12, sigma=0.38064, clip_norm=0.055, delta=1e-4,
                   coordinates=4096, canaries=4000, certified_epsilon=8.0)


def _audit():
    return audit_mechanism(SETUP, seed=21, calibrate=True)


def test_the_correct_mechanism_passes():
    audit = _audit()
    require_passed(audit)
    f = audit.fdp_bound
    assert not audit.flagged_by and not f["certified_rejected"]
    # the f-DP bound stays below the certificate at its delta, and is far above the count one
    assert f["epsilon_lower_bound"] <= audit.analytic["certified_epsilon_at_bound_delta"]
    assert f["epsilon_lower_bound"] > 2 * audit.whitebox_bound["epsilon_lower_bound"]


def _flagged_by(expected: str) -> tuple[str, ...]:
    audit = _audit()
    with pytest.raises(MechanismAuditError, match="fails its certificate's audit"):
        require_passed(audit)
    assert expected in audit.flagged_by, audit.flagged_by
    return audit.flagged_by


def test_noise_std_halved_is_flagged_by_the_bound_alone(monkeypatch):
    real = mechanism.add_gaussian_noise
    monkeypatch.setattr(mechanism, "add_gaussian_noise",
                        lambda s, sigma, c, src: real(s, sigma / 2, c, src))
    audit = audit_mechanism(SETUP, seed=21)             # no audit mode: the bound alone
    assert audit.flagged_by == ("f-DP one-run bound",)
    assert audit.fdp_bound["epsilon_lower_bound"] > \
        audit.analytic["certified_epsilon_at_bound_delta"]
    _flagged_by("audit mode mu / noise scale")


def test_no_clipping_is_flagged(monkeypatch):
    monkeypatch.setattr(mechanism, "clip_per_record",
                        lambda g, c: {k: v.double() for k, v in g.items()})
    assert "f-DP one-run bound" in _flagged_by("audit mode mu / noise scale")


def test_noise_per_prompt_is_flagged(monkeypatch):
    real = whitebox.privatize

    def per_prompt(grads, *, noise_multiplier, expected_batch, **kw):
        b = mechanism.num_records(grads)      # each record adds N(0, sigma^2 C^2 / (q n))
        return real(grads, noise_multiplier=noise_multiplier * math.sqrt(b / expected_batch),
                    expected_batch=expected_batch, **kw)

    monkeypatch.setattr(whitebox, "privatize", per_prompt)
    assert "f-DP one-run bound" in _flagged_by("audit mode mu / noise scale")


def test_a_round_key_drawn_once_is_flagged_by_the_independence_check(monkeypatch):
    real = noise.seeded_key
    monkeypatch.setattr(noise, "seeded_key", lambda seed, round_index: real(seed, 0))
    by = _flagged_by("noise independence across rounds")
    assert "noise independence across rounds (audit mode)" in by
    assert "f-DP one-run bound" not in by       # the bound does not see it: the check must


def test_the_verify_check_catches_a_reused_key(monkeypatch):
    from dpgrpo.verify.mechanism import _noise_rounds, noise_round_independence

    assert _noise_rounds() > 1e-6
    key = os.urandom(noise.KEY_BYTES)
    monkeypatch.setattr(noise, "read_entropy", lambda nbytes: key)
    ind = noise_round_independence()
    assert ind["flagged_by"] == ["consecutive", "any_pair", "pooled"]
    assert _noise_rounds() <= 1e-6
