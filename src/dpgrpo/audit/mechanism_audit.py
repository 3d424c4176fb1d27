"""``dpgrpo audit mechanism``: audit the privacy mechanism itself with gradient canaries.

One call runs the real mechanism over K gradient canaries for T rounds
(:func:`dpgrpo.audit.whitebox.simulate`) and reports, beside the certified epsilon:

* the one-run lower bound at 95% (Steinke et al.) for the white-box adversary and for the
  final-model adversary;
* the f-DP one-run bound at 95% (:mod:`dpgrpo.audit.fdp`: the certified mechanism's trade-off
  family, order statistics of the most confident guesses), which a bug that leaks more than
  certified pushes above the certificate;
* the check that the rounds' noises are independent (:mod:`dpgrpo.audit.independence`), in the
  run and in audit mode;
* the one-shot Gaussian estimate (Andrew et al.): mu and its epsilon at the run's delta;
* the analytic values the certificate implies for the same observations;
* with ``calibrate=True``, audit mode: the same sigma, C, T and trainable space at q = 1, where
  the certificate fixes the canary statistic's mu at sqrt(T)/sigma; a mechanism whose measured mu
  or noise scale is off by more than 5% is flagged (the audit's way to fail).

A lower bound is a proof (at its confidence) that the mechanism is no better than that epsilon;
it proves nothing about an upper bound. docs/auditing.md says what each number means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgrpo.audit.fdp import (
    design_r,
    epsilon_of_mu,
    fdp_bound,
    guesses,
    largest_rejected_mu,
    r_grid,
)
from dpgrpo.audit.independence import describe, round_independence
from dpgrpo.audit.whitebox import BROKEN, AuditSetup, Observation, simulate
from dpgrpo.audit.whitebox_stats import (
    analytic,
    calibration,
    count_ceiling,
    design,
    gaussian_fit,
    llr_scores,
    one_run_bound,
    sum_statistic,
)
from dpgrpo.errors import ConfigError, MechanismAuditError
from dpgrpo.release.files import certified_rounds

if TYPE_CHECKING:
    from dpgrpo.config import RunConfig

#: Model-free audits put K canaries in K slots of their own beside the run's n (same q), so K
#: is not limited by n; with the bound at delta' = 0.01/K (whitebox.BOUND_DELTA_MASS), about
#: 16,000 canaries give the study's operating point a median bound of 2.8 (design simulation).
DEFAULT_CANARIES = 16_000


@dataclass(frozen=True)
class MechanismAudit:
    """Every figure of one audit (JSON-ready through :meth:`to_dict`)."""

    setup: dict
    mechanism: str
    certified_epsilon: float | None
    whitebox_bound: dict
    final_bound: dict
    whitebox_fit: dict
    final_fit: dict
    analytic: dict
    calibration: dict | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    fdp_bound: dict | None = None
    independence: dict | None = None

    @property
    def flagged_by(self) -> tuple[str, ...]:
        """The statistics that flagged the mechanism (empty: passed): a one-run bound above
        what the certificate claims at the bound's delta, audit mode's mu or noise scale, or
        the rounds' noises correlated (in the run or in audit mode)."""
        claimed = self.analytic.get("certified_epsilon_at_bound_delta", self.certified_epsilon)
        out = []
        if self.certified_epsilon is not None and max(
                self.whitebox_bound["epsilon_lower_bound"],
                self.final_bound["epsilon_lower_bound"]) > claimed:
            out.append("count-based one-run bound")
        if (self.fdp_bound or {}).get("flagged"):
            out.append("f-DP one-run bound")
        cal = self.calibration or {}
        if cal.get("flagged"):
            out.append("audit mode mu / noise scale")
        if (self.independence or {}).get("flagged"):
            out.append("noise independence across rounds")
        if (cal.get("independence") or {}).get("flagged"):
            out.append("noise independence across rounds (audit mode)")
        return tuple(out)

    @property
    def flagged(self) -> bool:
        return bool(self.flagged_by)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "flagged": self.flagged, "flagged_by": list(self.flagged_by)}


def _bounds(obs: Observation, s: AuditSetup, confidence: float, selection: str
            ) -> tuple[dict, dict, dict]:
    scores = llr_scores(obs.rounds, s.q, s.sigma)
    delta = s.bound_delta
    info: dict[str, object] = {}
    if selection == "design":
        ks, expected = design(s.canaries, s.q, s.sigma, s.rounds, delta, confidence)
        info = {"design_median_bound": expected}
        wb = one_run_bound(scores, obs.included, delta=delta, confidence=confidence,
                           selection="design", ks=ks)
    else:
        wb = one_run_bound(scores, obs.included, delta=delta, confidence=confidence)
    final = one_run_bound(obs.final, obs.included, delta=delta, confidence=confidence)
    # the most any count-based one-run bound could prove from the same guesses (whitebox_stats)
    ceiling = count_ceiling(wb.r, wb.v, confidence=confidence)
    return wb.to_dict() | {"count_ceiling": ceiling}, final.to_dict(), info


def _fdp(scores: np.ndarray, included: np.ndarray, s: AuditSetup, confidence: float,
         selection: str) -> dict:
    """The f-DP one-run bound (:mod:`dpgrpo.audit.fdp`) with r fixed by the public design
    simulation, or chosen on a public random half and applied to the other half."""
    common: dict[str, Any] = dict(q=s.q, sigma=s.sigma, rounds=s.rounds,
                                  delta=s.bound_delta, confidence=confidence)
    extra: dict[str, float] = {}
    if selection == "design":
        r, ratio = design_r(s.canaries, s.q, s.sigma, s.rounds, confidence)
        b = fdp_bound(scores, included, r=r, selection="design", **common)
        extra["design_median_bound"] = epsilon_of_mu(ratio / s.sigma, s.q, s.rounds,
                                                     s.bound_delta)
    else:
        order = np.random.default_rng(0).permutation(scores.size)      # public split
        a, bb = order[: scores.size // 2], order[scores.size // 2:]
        inc = np.asarray(included, dtype=bool)

        def mu_hat(r: int) -> float:
            return largest_rejected_mu(mu_cert=1 / s.sigma, q=s.q, rounds=s.rounds, m=a.size,
                                       r=r, u=guesses(scores[a], inc[a], r),
                                       confidence=confidence)[0]

        r = max(r_grid(a.size), key=mu_hat)
        b = fdp_bound(scores[bb], inc[bb], r=r, selection="half", **common)
    run_delta = epsilon_of_mu(b.mu_rejected, s.q, s.rounds, s.delta,
                              coarse=b.mu_rejected > 1 / s.sigma)
    return b.to_dict() | extra | {"epsilon_at_run_delta": run_delta, "run_delta": s.delta}


def score(setup: AuditSetup, obs: Observation, mechanism: str = "correct", *,
          confidence: float = 0.95, selection: str = "design") -> MechanismAudit:
    """Every statistic of one observed run (no audit mode)."""
    if selection not in ("design", "half"):
        raise ConfigError(f"selection must be 'design' or 'half', got {selection!r}")
    wb, final, info = _bounds(obs, setup, confidence, selection)
    fdp = _fdp(llr_scores(obs.rounds, setup.q, setup.sigma), obs.included, setup, confidence,
               selection)
    return MechanismAudit(
        setup=setup.to_dict(), mechanism=mechanism, certified_epsilon=setup.certified_epsilon,
        whitebox_bound=wb, final_bound=final,
        whitebox_fit=gaussian_fit(sum_statistic(obs.rounds), obs.included, setup.delta).to_dict(),
        final_fit=gaussian_fit(obs.final, obs.included, setup.delta).to_dict(),
        analytic=analytic(setup.q, setup.sigma, setup.rounds, setup.delta,
                          bound_delta=setup.bound_delta) | info,
        seconds=obs.seconds, fdp_bound=fdp,
        independence=round_independence(obs.rounds, obs.included).to_dict())


def audit_mechanism(setup: AuditSetup, mechanism: str = "correct", *, seed: int | None = None,
                    confidence: float = 0.95, selection: str = "design",
                    calibrate: bool = False) -> MechanismAudit:
    """Run and score one model-free audit (module docstring); ``seed`` only for tests and
    benchmarks. ``calibrate`` adds audit mode (q = 1), the part that can fail."""
    audit = score(setup, simulate(setup, mechanism, seed=seed), mechanism,
                  confidence=confidence, selection=selection)
    return _with_calibration(audit, setup, mechanism, seed) if calibrate else audit


def _with_calibration(audit: MechanismAudit, setup: AuditSetup, mechanism: str,
                      seed: int | None) -> MechanismAudit:
    q1 = simulate(setup.audit_mode(), mechanism, seed=None if seed is None else seed + 100)
    cal = calibration(q1.rounds, q1.included, sigma=setup.sigma).to_dict()
    cal["independence"] = round_independence(q1.rounds, q1.included).to_dict()
    return replace(audit, calibration=cal, seconds=audit.seconds + q1.seconds)


def audit_end_to_end(config: RunConfig, run_dir: str | Path, *, canaries: int,
                     mechanism: str = "correct", seed: int | None = None,
                     confidence: float = 0.95, selection: str = "design",
                     calibrate: bool = False) -> MechanismAudit:
    """The end-to-end mode (:mod:`dpgrpo.audit.end_to_end`): real rollouts and per-prompt
    gradients of ``config``'s model and task beside the canaries, then the same statistics."""
    from dpgrpo.audit.end_to_end import simulate_end_to_end

    setup, obs = simulate_end_to_end(config, run_dir, canaries=canaries, mechanism=mechanism,
                                     seed=seed)
    audit = replace(score(setup, obs, mechanism, confidence=confidence, selection=selection),
                    extra={"mode": "end-to-end", "model": config.model.name,
                           "task": config.data.task})
    return _with_calibration(audit, setup, mechanism, seed) if calibrate else audit


def detection(setup: AuditSetup, *, trials: int = 1, seed: int | None = None,
              mechanisms: tuple[str, ...] = ("correct", *BROKEN)) -> dict[str, dict]:
    """Audit mode (q = 1) on each mechanism ``trials`` times: how often each is flagged (by
    mu, the noise scale or the rounds' independence), and the measured mu relative to
    sqrt(T)/sigma."""
    mode = setup.audit_mode()
    out: dict[str, dict] = {}
    for j, name in enumerate(mechanisms):
        obs = [simulate(mode, name, seed=None if seed is None else seed + 1000 * j + t)
               for t in range(trials)]
        cals = [calibration(o.rounds, o.included, sigma=mode.sigma) for o in obs]
        inds = [round_independence(o.rounds, o.included) for o in obs]
        ratios = [c.mu_ratio for c in cals]
        out[name] = {"flagged": sum(c.flagged or i.flagged for c, i in zip(cals, inds)),
                     "flagged_by_independence": sum(i.flagged for i in inds), "trials": trials,
                     "mu_ratio_min": float(np.min(ratios)), "mu_ratio_max": float(np.max(ratios)),
                     "noise_scale_mean": float(np.mean([c.noise_scale for c in cals]))}
    return out


def setup_from_certificate(cert: dict, *, canaries: int | None = None, **overrides: Any
                           ) -> AuditSetup:
    """The audit's public parameters from a run's certificate (release/certificate.json)."""
    if not cert.get("private", True) or not cert.get("sigma"):
        raise ConfigError("the certificate is not of a private run: nothing to audit")
    k = DEFAULT_CANARIES if canaries is None else canaries
    n = int(cert["n"]) + k                  # the canaries' slots beside the run's own
    fields = dict(n=n, q=float(cert["q"]), rounds=int(certified_rounds(cert)),
                  sigma=float(cert["sigma"]),
                  clip_norm=float(cert["clip_norm"]), delta=float(cert["delta"]),
                  coordinates=max(int(cert.get("trainable_coordinates") or 0), k),
                  canaries=k, certified_epsilon=float(cert["epsilon"]))
    return AuditSetup(**(fields | overrides))


def setup_from_config(config: RunConfig, *, canaries: int | None = None,
                      **overrides: Any) -> AuditSetup:
    """The audit's public parameters from a RunConfig, without training: n, q, T, C and the
    calibrated sigma (the trainable-coordinate count, which needs the model, defaults to
    max(K, 4096) unless given)."""
    from dpgrpo.privacy.accounting import RoundEvent, default_delta, epsilon, sampling_rate
    from dpgrpo.privacy.calibration import calibrate

    p = config.privacy
    n = overrides.pop("n", None) or config.data.n_slots
    if n is None:
        raise ConfigError("the audit needs the public slot count n: set data.n_slots or pass n "
                          "(or audit a trained run's certificate with --run)")
    q = sampling_rate(int(n), p.expected_batch)
    delta = p.delta or default_delta(int(n))
    rounds = config.train.rounds
    sigma = p.noise_multiplier or calibrate(int(n), p.expected_batch, rounds, p.epsilon,
                                            delta).sigma
    k = DEFAULT_CANARIES if canaries is None else canaries
    fields = dict(n=int(n) + k, q=q, rounds=rounds, sigma=float(sigma), clip_norm=p.clip_norm,
                  delta=delta,
                  coordinates=max(k, 4096), canaries=k,
                  certified_epsilon=epsilon([RoundEvent(q, float(sigma), rounds)], delta),
                  learning_rate=config.train.learning_rate,
                  weight_decay=config.train.weight_decay)
    return AuditSetup(**(fields | overrides))


def read_certificate(run_dir: str | Path) -> dict:
    """``RUN_DIR/release/certificate.json``."""
    path = Path(run_dir) / "release" / "certificate.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read the run's certificate {path}: {err}") from err


def require_passed(audit: MechanismAudit) -> None:
    """Raise :class:`MechanismAuditError` when the audit flags the mechanism, naming every
    statistic that flagged it."""
    if not audit.flagged:
        return
    cal, fdp = audit.calibration or {}, audit.fdp_bound or {}
    details = []
    for name in audit.flagged_by:
        if name == "audit mode mu / noise scale":
            details.append(f"audit mode: measured mu {cal['mu']:.3f} vs certified "
                           f"{cal['mu_certified']:.3f}, noise scale {cal['noise_scale']:.3f}")
        elif name == "f-DP one-run bound":
            details.append(f"f-DP one-run bound {fdp['epsilon_lower_bound']:.3f} above the "
                           f"certificate's {audit.analytic['certified_epsilon_at_bound_delta']:.3f}"
                           f" at delta' {fdp['delta']:.2g} (the certified curve rejected at "
                           f"p = {fdp['p_certified']:.2g} < {fdp['flag_level']:.2g})")
        elif name == "noise independence across rounds":
            details.append(describe(audit.independence or {}))
        elif name.startswith("noise independence"):
            details.append(describe(cal["independence"]) + " (audit mode)")
        else:
            details.append(f"one-run lower bound above the certified epsilon "
                           f"{audit.certified_epsilon}")
    raise MechanismAuditError(f"the {audit.mechanism} mechanism fails its certificate's audit: "
                              f"{'; '.join(details)}; the certified epsilon cannot be trusted")


def summary_lines(audit: MechanismAudit) -> str:
    """The audit's figures in a few lines, certified epsilon beside each."""
    s, a = audit.setup, audit.analytic
    cert = "n/a" if audit.certified_epsilon is None else f"{audit.certified_epsilon:.3f}"
    wb, fb, wf, ff = audit.whitebox_bound, audit.final_bound, audit.whitebox_fit, audit.final_fit
    lines = [
        f"mechanism audit ({audit.mechanism}): K = {s['canaries']} gradient canaries, n = "
        f"{s['n']}, q = {s['q']:.4g}, T = {s['rounds']}, sigma = {s['sigma']:.4g}, C = "
        f"{s['clip_norm']:.4g}, d = {s['coordinates']}, delta = {s['delta']:.3g}; certified "
        f"epsilon {cert}",
        f"  one-run lower bound ({wb['confidence']:.0%}, at delta' = {a['bound_delta']:.2g}, where "
        f"the certificate claims epsilon {a['certified_epsilon_at_bound_delta']:.3f}): white-box "
        f"{wb['epsilon_lower_bound']:.3f}"
        f" ({wb['v']}/{wb['r']} correct; no count-based one-run bound could prove more than "
        f"{wb.get('count_ceiling', float('nan')):.3f} from them), final model "
        f"{fb['epsilon_lower_bound']:.3f} ({fb['v']}/{fb['r']})",
        _fdp_line(audit),
        f"  {describe(audit.independence or {})}" if audit.independence else "",
        f"  one-shot Gaussian fit: white-box mu {wf['mu']:.3f} (epsilon {wf['epsilon']:.3f}), "
        f"final model mu {ff['mu']:.3f} (epsilon {ff['epsilon']:.3f})",
        f"  analytic: white-box epsilon {a['whitebox_epsilon']:.3f}; the statistic's mu "
        f"{a['statistic_mu']:.3f} (epsilon {a['statistic_epsilon']:.3f})"
        + (f"; expected one-run bound {a['design_median_bound']:.3f}"
           if "design_median_bound" in a else ""),
    ]
    cal = audit.calibration
    if cal is not None:
        lines.append(f"  audit mode (q = 1): mu {cal['mu']:.3f} vs certified "
                     f"{cal['mu_certified']:.3f} (ratio {cal['mu_ratio']:.3f}), noise scale "
                     f"{cal['noise_scale']:.3f}: {'FLAGGED' if cal['flagged'] else 'passed'} "
                     f"(tolerance {cal['tolerance']:.0%})")
        if cal.get("independence"):
            lines.append(f"  audit mode: {describe(cal['independence'])}")
    verdict = ("FLAGGED by " + ", ".join(audit.flagged_by)) if audit.flagged else "passed"
    lines.append(f"  verdict: {verdict}; {audit.seconds:.1f} s")
    return "\n".join(line for line in lines if line)


def _fdp_line(audit: MechanismAudit) -> str:
    """The f-DP one-run bound beside the certificate, at delta' and at the run's delta."""
    f, a = audit.fdp_bound, audit.analytic
    if not f:
        return ""
    cert_run = "n/a" if audit.certified_epsilon is None else f"{audit.certified_epsilon:.3f}"
    return (f"  f-DP one-run bound ({f['confidence']:.0%}, the certified curve's family): "
            f"{'at least ' if f['capped'] else ''}{f['epsilon_lower_bound']:.3f} at delta' "
            f"(certificate "
            f"{a['certified_epsilon_at_bound_delta']:.3f}), {f['epsilon_at_run_delta']:.3f} at "
            f"delta {f['run_delta']:.3g} (certificate {cert_run}); {f['u']} wrong of the "
            f"{f['r']} most confident guesses, sigma' = {1 / f['mu_rejected']:.4g} rejected; "
            f"the certified curve's p = {f['p_certified']:.2g} (flag below {f['flag_level']:.2g})"
            if f["mu_rejected"] > 0 else
            f"  f-DP one-run bound ({f['confidence']:.0%}): 0 ({f['u']} wrong of {f['r']})") + (
            f"; expected {f['design_median_bound']:.3f}" if "design_median_bound" in f else "")


__all__ = ["MechanismAudit", "audit_end_to_end", "audit_mechanism", "detection",
           "read_certificate", "require_passed", "score", "setup_from_certificate",
           "setup_from_config", "summary_lines"]
