"""The CPU study's headline numbers (``cpu-study.json``'s ``summary``) from its results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from statistics import NormalDist

from dpgrpo.config.arms import CONTROL_ARM, FOCAL_ARM
from dpgrpo.config.experiments import BASE_ARM, NON_PRIVATE_ARM
from dpgrpo.config.json_types import JSON, JSONValue
from dpgrpo.errors import ConfigError
from dpgrpo.experiments.study_steps import WARM_START
from dpgrpo.privacy.planning import noise_to_signal
from dpgrpo.release.files import certified_rounds


def _contrast(report: Mapping[str, JSONValue], arm: str, comparator: str) -> JSON:
    rows = [*report["contrasts"], *report["versus_base"], *report.get("versus_fixed", [])]
    row = next((r for r in rows if r["arm"] == arm and r["comparator"] == comparator
                and r["scorer"] == "strict"), None)
    if row is None:
        raise ConfigError(f"the comparison has no contrast {arm} - {comparator}")
    mde = row.get("mde")
    if mde is None:      # the report gives it only for null results; the study always wants it
        z = NormalDist().inv_cdf
        mde = (z(0.975) + z(0.8)) * row["se"]
    runs = row.get("ci_runs")
    return {"pp": row["difference"], "ci": list(row["ci"]), "mde": mde,
            "holm_p": row.get("holm_p"), "a": row["accuracy_a"], "b": row["accuracy_b"],
            "ci_runs": list(runs) if runs is not None else None, "seed_p": row.get("seed_p"),
            # the seeds behind the claim: the trained arm's against a fixed model (the base,
            # the warm start: one row by design), else the fewer of the two arms'
            "seeds": (row.get("n_seeds") or [1, 1])[0] if comparator in
            (report.get("base"), WARM_START) else min(row.get("n_seeds") or [1, 1])}


def _runs_keys(key: str, c: Mapping[str, object]) -> JSON:
    """``<key>_ci_runs`` (seeds then problems), ``<key>_seed_p`` (Welch over seeds) and
    ``<key>_seeds`` (the fewer seeds of the two arms) of one headline contrast."""
    return {f"{key}_ci_runs": c["ci_runs"], f"{key}_seed_p": c["seed_p"],
            f"{key}_seeds": c["seeds"]}


def jsonable(x: object) -> JSONValue:
    return json.loads(json.dumps(x, default=str))


def _auc(mia: Mapping[str, JSONValue]) -> tuple[float, list[float]]:
    pooled = mia["diba"]["pooled"]
    return pooled["auc"], [pooled["extra"]["auc_ci_low"], pooled["extra"]["auc_ci_high"]]


def _permuted(key: str, mia: Mapping[str, JSONValue] | None) -> JSON:
    """``<key>_p`` (upper tail: members score higher), ``<key>_p_lower`` and
    ``<key>_p_two_sided`` (issue 58; None for a test drawn one-sided, as every test saved
    before the two tails were drawn), ``<key>_null`` (central 95% of the null AUCs),
    ``<key>_draws`` (shuffles drawn), ``<key>_permutations`` (at most) and
    ``<key>_stop_after`` (Besag and Clifford's h; None: the fixed test, as every test saved
    before the rule existed) of a permutation test."""
    test = (mia or {}).get("permutation")
    if not test:
        return {}
    return {f"{key}_p": test["p_value"], f"{key}_p_lower": test.get("p_value_lower"),
            f"{key}_p_two_sided": test.get("p_value_two_sided"),
            f"{key}_null": test["null_band"],
            f"{key}_draws": test.get("draws", test["permutations"]),
            f"{key}_permutations": test["permutations"],
            f"{key}_stop_after": test.get("stop_after")}


def _whitebox_keys(audit: Mapping[str, JSONValue] | None) -> JSON:
    """The white-box audit's keys (none for results from before the audit existed)."""
    if not audit:
        return {}
    return {"whitebox_eps_lower_bound": audit["whitebox_bound"]["epsilon_lower_bound"],
            "whitebox_count_ceiling": audit["whitebox_bound"].get("count_ceiling"),
            "whitebox_flagged": audit["flagged"]}


def _warm_start_keys(
    results: Mapping[str, JSONValue],
    report: Mapping[str, JSONValue],
    dp_gain: float,
    nonprivate_gain: float,
) -> JSON:
    """What the public warm start gives alone, and what DP-GRPO adds to it (none without one)."""
    warm = results.get("warm_start")
    if not warm:
        return {}
    alone = next(a for a in report["arms"] if a["name"] == WARM_START)["accuracy"]["strict"]
    base = next(a for a in report["arms"] if a["name"] == report["base"])["accuracy"]["strict"]
    over = _contrast(report, FOCAL_ARM, WARM_START)
    np_over = nonprivate_gain - (alone - base)
    # the control against its own start: noise (and the KL term) alone, from the warm start
    control = (_contrast(report, CONTROL_ARM, WARM_START)
               if report.get("versus_fixed") else None)
    return {"warm_start_accuracy": alone, "warm_start_gain_pp": alone - base,
            "dp_vs_warm_start_pp": over["pp"], "dp_vs_warm_start_ci": over["ci"],
            **_runs_keys("dp_vs_warm_start", over),
            # how much of DP-GRPO's gain over the base the warm start alone gives
            "warm_start_share_of_dp_gain": (alone - base) / dp_gain if dp_gain > 0 else None,
            **({"control_vs_warm_start_pp": control["pp"],
                "control_vs_warm_start_ci": control["ci"]} if control else {}),
            # undefined when non-private GRPO did not gain over its own start
            "retained_share_over_warm_start": (dp_gain - (alone - base)) / np_over
            if np_over > 0 else None}


def summarize(results: Mapping[str, JSONValue], wall: float) -> JSON:
    """The keys of ``cpu-study.json`` that the issue and the results page name."""
    report, cert = results["report"], results["dp_certificate"]
    nonprivate = _contrast(report, NON_PRIVATE_ARM, BASE_ARM)
    dp = _contrast(report, FOCAL_ARM, CONTROL_ARM)
    leaky_auc, leaky_ci = _auc(results["leaky_mia"])
    dp_auc, dp_ci = _auc(results["private_mia"])
    canary = results["canary"]
    dp_leaky = {}
    if results.get("dp_leaky_mia"):
        auc, ci = _auc(results["dp_leaky_mia"])
        dp_leaky = {"audit_dp_leaky_auc": auc, "audit_dp_leaky_auc_ci": ci,
                    "audit_dp_leaky_auc_ceiling": results["dp_leaky_mia"]["certified_auc_ceiling"],
                    **_permuted("audit_dp_leaky_auc", results["dp_leaky_mia"])}
    dp_gain = _contrast(report, FOCAL_ARM, BASE_ARM)["pp"]
    return {**_warm_start_keys(results, report, dp_gain, nonprivate["pp"]),
        "nonprivate_gain_pp": nonprivate["pp"], "nonprivate_gain_ci": nonprivate["ci"],
        **_runs_keys("nonprivate_gain", nonprivate), **_runs_keys("dp_vs_control", dp),
        "dp_gain_pp": dp_gain,
        "retained_share": dp_gain / nonprivate["pp"] if nonprivate["pp"] else None,
        "trainable_params": cert["trainable_coordinates"],
        "completions_per_arm": cert["expected_batch"] * cert["group_size"] * certified_rounds(cert),
        "dp_vs_control_pp": dp["pp"], "dp_vs_control_ci": dp["ci"],
        "dp_vs_control_mde": dp["mde"],
        "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                           cert["expected_batch"]),
        "audit_leaky_auc": leaky_auc, "audit_leaky_auc_ci": leaky_ci,
        **_permuted("audit_leaky_auc", results["leaky_mia"]),
        "audit_dp_auc": dp_auc, "audit_dp_auc_ci": dp_ci,
        **_permuted("audit_dp_auc", results["private_mia"]),
        "audit_dp_auc_ceiling": results["private_mia"]["certified_auc_ceiling"], **dp_leaky,
        "canary_eps_lower_bound": canary["empirical_epsilon_lower_bound"],
        "certified_eps": canary["certified_epsilon"],
        **_whitebox_keys(results.get("whitebox")),
        "dp_grpo_certified_eps": cert["epsilon"],
        "sweep": [{k: s[k] for k in ("epsilon", "dp_vs_control_pp", "dp_vs_control_ci", "mde",
                                     "refused") if k in s} for s in results["sweep"]],
        "wall_seconds": round(wall, 1),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results["steps"]),
    }


__all__ = ["jsonable", "summarize"]
