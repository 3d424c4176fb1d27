"""The white-box mechanism audit: canary directions, the statistics with real numbers, and an
audit that passes the real mechanism and fails each deliberately broken one (issue 27)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from dpgrpo.audit.gradient_canaries import make_directions
from dpgrpo.audit.mechanism_audit import (
    DEFAULT_CANARIES,
    audit_mechanism,
    detection,
    require_passed,
    setup_from_certificate,
)
from dpgrpo.audit.one_run import lower_bound_from_counts
from dpgrpo.audit.whitebox import BROKEN, AuditSetup, simulate
from dpgrpo.audit.whitebox_stats import (
    ceiling_design,
    count_ceiling,
    design,
    gaussian_fit,
    gdp_epsilon,
    llr_scores,
    one_run_bound,
    sum_statistic,
)
from dpgrpo.errors import ConfigError, MechanismAuditError

#: The study's operating point until 2026-12-03 (configs/cpu-study.toml then): n 1,000, q 0.008,
#: T 12, sigma 0.344.
OPERATING = dict(n=1000, q=0.008, rounds=12, sigma=0.344, clip_norm=0.055, delta=1e-4,
                 coordinates=1024, canaries=1000, certified_epsilon=8.0)


def test_directions_are_orthonormal_dense_and_projected_by_one_transform():
    dirs = make_directions(512, 200, seed=3)
    m = dirs.matrix()
    assert np.abs(m @ m.T - np.eye(200)).max() < 1e-12
    half = (m[:, :256] ** 2).sum(axis=1)              # mass on the first half of the vector
    assert half.min() > 0.35 and half.max() < 0.65
    v = np.random.default_rng(0).standard_normal(512)
    assert np.abs(dirs.project(v) - m @ v).max() < 1e-12
    some = [7, 0, 199]                                  # rows built on demand are the same
    assert np.abs(dirs.gradients(some).double().numpy() - m[some]).max() < 1e-6


def test_setup_refuses_what_the_audit_cannot_measure():
    with pytest.raises(ConfigError):
        AuditSetup(**(OPERATING | {"canaries": 1001}))          # more canaries than slots
    with pytest.raises(ConfigError):
        AuditSetup(**(OPERATING | {"coordinates": 999}))        # not orthonormal in d < K
    with pytest.raises(ConfigError):
        AuditSetup(**(OPERATING | {"canary_scale": 1.0}))       # clipping would not act


def test_gdp_epsilon_solves_the_gaussian_privacy_profile():
    # delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) for mu-GDP (Dong et al.)
    for mu in (0.5, 1.0, 3.0, 10.07):
        eps = gdp_epsilon(mu, 1e-5)
        profile = (stats.norm.cdf(-eps / mu + mu / 2)
                   - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))
        assert profile <= 1e-5 * 1.001 and profile >= 1e-5 * 0.95
    assert gdp_epsilon(0.0, 1e-5) == 0.0 and gdp_epsilon(-1.0, 1e-5) == 0.0


def test_gaussian_fit_recovers_mu_and_llr_beats_the_sum_at_small_q():
    rng = np.random.default_rng(1)
    bits = rng.random(20_000) < 0.5
    fit = gaussian_fit(rng.standard_normal(20_000) + 1.5 * bits, bits, 1e-5)
    assert fit.mu == pytest.approx(1.5, abs=0.05) and fit.sd_out == pytest.approx(1.0, abs=0.02)
    # q = 0.008: a canary is seen in about one round in ten runs; the coin-aware likelihood
    # ratio finds the rounds where it was, the plain sum averages them away.
    q, sigma, t = 0.008, 0.344, 12
    coins = (rng.random((t, 20_000)) < q) & bits
    y = rng.standard_normal((t, 20_000)) + coins / sigma
    from dpgrpo.audit.metrics import tpr_at_fpr

    tpr_llr = tpr_at_fpr(bits, llr_scores(y, q, sigma), 0.01)
    tpr_sum = tpr_at_fpr(bits, sum_statistic(y), 0.01)
    assert tpr_llr > 1.8 * tpr_sum and tpr_llr > 0.03


def test_half_selection_gives_no_bound_without_signal():
    rng = np.random.default_rng(2)
    bounds = [one_run_bound(rng.standard_normal(1000), rng.random(1000) < 0.5, delta=1e-4,
                            seed=i).epsilon_lower_bound for i in range(20)]
    assert sum(b > 0 for b in bounds) <= 2             # 95% confidence: about 1 in 20


def test_audit_mode_measures_mu_and_flags_every_broken_mechanism():
    setup = AuditSetup(**(OPERATING | {"canaries": 800}))
    out = detection(setup, trials=3, seed=11)
    mu_ok = out["correct"]
    assert mu_ok["flagged"] == 0
    assert mu_ok["mu_ratio_min"] >= 0.95 and mu_ok["mu_ratio_max"] <= 1.05   # sqrt(T)/sigma +-5%
    assert all(out[b]["flagged"] == 3 for b in BROKEN), out
    assert out["half_sigma"]["mu_ratio_min"] > 1.8                 # mu doubles
    assert out["no_clipping"]["mu_ratio_min"] > 8                  # canaries of norm 10 C
    assert out["half_coordinates"]["mu_ratio_min"] > 1.3           # about sqrt(2)
    assert out["realized_batch"]["noise_scale_mean"] > 1.6         # q n / B = 2 at q = 1


def test_operating_point_bound_stays_below_the_certificate_and_the_design_predicts_it():
    setup = AuditSetup(**OPERATING)
    (k_plus, _), expected = design(1000, 0.008, 0.344, 12, 1e-4)
    assert 0.3 < expected < 8.0 and k_plus >= 5
    audits = [audit_mechanism(setup, seed=100 + i) for i in range(4)]
    for a in audits:
        assert a.whitebox_bound["epsilon_lower_bound"] <= 8.0
        assert a.final_bound["epsilon_lower_bound"] <= 8.0
        assert a.analytic["whitebox_epsilon"] == pytest.approx(8.0, abs=0.05)
        assert not a.flagged
    assert max(a.whitebox_bound["epsilon_lower_bound"] for a in audits) > 0.0


def test_realized_batch_denominator_changes_the_observation_even_at_small_q():
    base = simulate(AuditSetup(**OPERATING), seed=5)
    bad = simulate(AuditSetup(**OPERATING), "realized_batch", seed=5)
    assert np.array_equal(base.included, bad.included)
    assert not np.allclose(base.rounds, bad.rounds)


def test_require_passed_raises_the_dedicated_error():
    setup = AuditSetup(**(OPERATING | {"canaries": 600}))
    good = audit_mechanism(setup, seed=3, calibrate=True)
    require_passed(good)
    bad = audit_mechanism(setup, "half_sigma", seed=3, calibrate=True)
    assert bad.flagged and bad.calibration["mu_ratio"] > 1.8
    with pytest.raises(MechanismAuditError, match="half_sigma"):
        require_passed(bad)
    json.dumps(good.to_dict())                          # JSON-ready


def test_verify_check_passes_and_fails_on_a_broken_mechanism():
    from dpgrpo.verify.mechanism import audit_verdict_errors

    assert audit_verdict_errors() == 0
    assert audit_verdict_errors("half_sigma") >= 1      # as if privatize itself were broken
    assert audit_verdict_errors("realized_batch") >= 1


def _certificate(**kw):
    cert = {"private": True, "epsilon": 8.0, "delta": 1e-4, "q": 0.05, "sigma": 0.6,
            "clip_norm": 0.055, "n": 200, "rounds": 3, "trainable_coordinates": 256}
    return cert | kw


def test_study_step_audits_the_certificate_and_the_results_page_prints_it(tmp_path):
    from dpgrpo.experiments.study_steps import _whitebox
    from dpgrpo.reports.study import _whitebox_sentence

    audit = _whitebox(_certificate(), tmp_path / "mechanism")
    k = DEFAULT_CANARIES                                 # slots of their own beside the run's
    assert audit["setup"]["n"] == 200 + k and audit["setup"]["canaries"] == k
    assert audit["setup"]["coordinates"] == k and not audit["flagged"]
    assert audit["analytic"]["bound_delta"] == pytest.approx(0.01 / k)
    assert audit["calibration"]["mu_certified"] == pytest.approx(math.sqrt(3) / 0.6)
    again = _whitebox(_certificate(sigma=0.1), tmp_path / "mechanism")   # resumable: reused
    assert again == json.loads((tmp_path / "mechanism" / "summary.json").read_text()) == audit
    text = _whitebox_sentence(audit)
    assert f"{audit['whitebox_bound']['epsilon_lower_bound']:.3f}" in text and "passed" in text


def test_a_certificate_that_names_t_steps_is_audited_like_one_that_names_it_rounds():
    """dpgrpo 0.2.0 wrote T as the certificate's "steps"; a released run outlives the name."""
    old = {k: v for k, v in _certificate().items() if k != "rounds"} | {"steps": 3}
    assert setup_from_certificate(old) == setup_from_certificate(_certificate())
    assert setup_from_certificate(old).rounds == 3
    with pytest.raises(KeyError, match="rounds"):          # neither name: not a certificate
        setup_from_certificate({k: v for k, v in old.items() if k != "steps"})


def test_cli_audits_a_run_and_fails_a_broken_mechanism(tmp_path):
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "certificate.json").write_text(json.dumps(_certificate()))
    record = tmp_path / "mechanism.json"
    res = CliRunner().invoke(app, ["audit", "mechanism", "--run", str(tmp_path), "--json",
                                   "--seed", "4", "-o", str(record)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["mechanism"] == "correct" and data["flagged"] is False
    assert json.loads(record.read_text()) == data
    res = CliRunner().invoke(app, ["audit", "mechanism", "--run", str(tmp_path), "-o",
                                   str(tmp_path / "release" / "x.json")])
    assert res.exit_code != 0                               # never inside a release
    res = CliRunner().invoke(app, ["audit", "mechanism", "--run", str(tmp_path),
                                   "--mechanism", "no_clipping", "--seed", "4"])
    assert res.exit_code != 0 and "FLAGGED" in res.output
    assert isinstance(res.exception, MechanismAuditError)


def test_canaries_among_random_background_records_still_pass_audit_mode():
    setup = AuditSetup(**(OPERATING | {"n": 600, "canaries": 400, "q": 0.05,
                                       "background": "random"}))
    obs = simulate(setup, seed=8)
    assert obs.rounds.shape == (12, 400) and np.isfinite(obs.final).all()
    a = audit_mechanism(setup, seed=8, calibrate=True, selection="half")
    assert not a.flagged and a.whitebox_bound["epsilon_lower_bound"] <= 8.0


def test_setup_from_the_study_config():
    from pathlib import Path

    from dpgrpo.audit.mechanism_audit import setup_from_config
    from dpgrpo.config import load_config

    # sigma given, as the study's calibration found it (calibrating here would take a minute)
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "cpu-study.toml",
                      ["privacy.noise_multiplier=0.4008"])
    # its adapter has 6,912 trainable coordinates: room for fewer orthonormal canaries than
    # the default 16,000, which is refused with the reason
    with pytest.raises(ConfigError, match="16000 orthonormal canaries need at least"):
        setup_from_config(cfg, n=1000, coordinates=6_912)
    setup = setup_from_config(cfg, n=1000, coordinates=6_912, canaries=6_000)
    assert setup.q == pytest.approx(0.032) and setup.sigma == 0.4008
    assert setup.certified_epsilon == pytest.approx(8.0, abs=0.01)
    assert setup.canaries == 6_000 and setup.n == 1000 + 6_000
    assert setup.audit_mode().canaries == 1000 and setup.audit_mode().q == 1.0
    with pytest.raises(ConfigError, match="n_slots"):
        setup_from_config(cfg)


E2E_TOML = """
[model]
name = "{model}"
device = "cpu"
[data]
task = "arithmetic"
limit = 8
n_slots = 208
[privacy]
expected_batch = 52
noise_multiplier = 1.0
[train]
rounds = 2
group_size = 2
max_new_tokens = 4
"""


def test_end_to_end_mode_puts_canaries_among_real_gradients(tiny_model_dir, tmp_path):
    from dpgrpo.audit.end_to_end import simulate_end_to_end
    from dpgrpo.audit.mechanism_audit import audit_end_to_end
    from dpgrpo.config import load_config

    path = tmp_path / "e2e.toml"
    path.write_text(E2E_TOML.format(model=tiny_model_dir))
    cfg = load_config(path)
    setup, obs = simulate_end_to_end(cfg, tmp_path / "run", canaries=200, seed=1)
    assert (setup.n, setup.q, setup.sigma, setup.rounds) == (208, pytest.approx(0.25), 1.0, 2)
    assert setup.coordinates >= 200 and obs.rounds.shape == (2, 200)
    assert np.isfinite(obs.rounds).all() and np.isfinite(obs.final).all()
    audit = audit_end_to_end(cfg, tmp_path / "run2", canaries=200, seed=2, selection="half",
                             calibrate=True)
    assert audit.extra["mode"] == "end-to-end" and not audit.flagged
    assert audit.whitebox_bound["epsilon_lower_bound"] <= audit.certified_epsilon
    with pytest.raises(ConfigError, match="absent slots"):
        simulate_end_to_end(cfg, tmp_path / "run3", canaries=201)
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    res = CliRunner().invoke(app, ["audit", "mechanism", str(path), "--end-to-end", "--canaries",
                                   "200", "--no-calibrate", "--selection", "half", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["extra"]["mode"] == "end-to-end"


def test_count_ceiling_is_randomized_response_and_caps_the_delta_bound():
    # 46 of 46 correct: 0.05 ** (1/46) = 0.9370 = e^eps / (1 + e^eps), eps = ln(0.937/0.063)
    p = 0.05 ** (1 / 46)
    assert count_ceiling(46, 46) == pytest.approx(math.log(p / (1 - p)), abs=2e-4)  # 2.699
    assert count_ceiling(10, 10) == pytest.approx(1.052, abs=1e-3)
    assert count_ceiling(0, 0) == 0.0 and count_ceiling(20, 10) == 0.0
    for r, v in [(21, 21), (40, 38), (46, 46)]:         # Steinke et al. at delta 1e-4, m 1,000
        assert lower_bound_from_counts(1000, r, v, delta=1e-4, confidence=0.95) <= \
            count_ceiling(r, v) + 1e-3
    with pytest.raises(ValueError):
        count_ceiling(3, 4)


def test_no_count_based_bound_reaches_2_at_the_operating_point_but_half_sigma_does():
    # The certified mechanism at n = K = 1,000, q 0.008, T 12 (public simulation, seeded): the
    # most any count-based one-run bound can prove stays near 1 (10 of 10 correct is 1.05),
    # below the oracle's 2.7; with sigma / 2 the ordinary (epsilon, delta) bound passes 2.
    ok = ceiling_design(1000, 0.008, 0.344, 12, trials=4, seed=1)
    assert ok.median < 1.5 and ok.maximum < 2.0 and 2.5 < ok.oracle_median < 2.9
    (_, _), broken = design(1000, 0.008, 0.172, 12, 1e-4, trials=4, seed=1)
    assert broken > 2.0


def test_canaries_beside_the_run_prove_more_than_two_at_the_operating_point():
    """16,000 canaries in slots of their own beside the study's 1,000 (same q, sigma, T, C):
    the bound at delta' = 0.01/K passes 2 in the median of seeded audits and stays below what
    the certificate claims at delta' (13.2), and the q = 1 mode still uses 1,000 canaries."""
    k = DEFAULT_CANARIES
    setup = AuditSetup(**(OPERATING | {"n": 1000 + k, "canaries": k, "coordinates": k}))
    assert setup.bound_delta == pytest.approx(0.01 / k) and setup.audit_mode().n == 1000
    audits = [audit_mechanism(setup, seed=s) for s in range(3)]
    bounds = [a.whitebox_bound["epsilon_lower_bound"] for a in audits]
    claimed = audits[0].analytic["certified_epsilon_at_bound_delta"]
    assert np.median(bounds) >= 2.0 and max(bounds) < claimed
    assert claimed == pytest.approx(13.2, abs=0.1) and not any(a.flagged for a in audits)
    assert audits[0].analytic["design_median_bound"] >= 2.5
