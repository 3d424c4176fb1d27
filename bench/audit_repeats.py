"""How often `dpgrpo audit mechanism` flags each mechanism over repeated audits (issue 58).

The documented setting (docs/auditing.md): the study's config, `configs/cpu-study.toml`, with
n = 1,000 public slots and d = 19,584 coordinates; K = 16,000 canaries in slots of their own
(q, sigma, T and C of the config, sigma calibrated by the accountant). Each repeat is one whole
audit as the CLI runs it (`audit_mechanism(..., calibrate=True)`: the run at the operating point
and audit mode, q = 1), with OS entropy (no seeds), and reports which statistics flagged it.

Goals: the correct mechanism flagged in <= 2 of 40, the reused-noise one (one noise vector for
every round) in >= 39 of 40; the correct mechanism's f-DP one-run bound >= 50% of the
certificate's epsilon at the bound's own delta; an audit under 5 minutes.

    PYTHONPATH=src .venv/bin/python bench/audit_repeats.py [--repeats 40]
        [--mechanisms correct,reused_noise] [--json]

Prints one JSON line per audit as it goes (stderr) and a summary per mechanism (stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

import torch

from dpgrpo.audit.mechanism_audit import audit_mechanism, setup_from_config
from dpgrpo.audit.whitebox import MECHANISMS
from dpgrpo.config import load_config

CONFIG = "configs/cpu-study.toml"
GOALS = {"correct": {"flagged_at_most": 2}, "reused_noise": {"flagged_at_least": 39}}


def one(setup, mechanism: str) -> dict:
    """One audit's figures (the CLI's own function, audit mode included)."""
    start = time.perf_counter()
    audit = audit_mechanism(setup, mechanism, calibrate=True)
    fdp = audit.fdp_bound or {}
    claimed = audit.analytic.get("certified_epsilon_at_bound_delta")
    bound = fdp.get("epsilon_lower_bound")
    return {"mechanism": mechanism, "flagged_by": list(audit.flagged_by),
            "fdp_bound": bound, "certified_at_bound_delta": claimed,
            "fdp_share": None if bound is None or not claimed else bound / claimed,
            "count_bound": audit.whitebox_bound["epsilon_lower_bound"],
            "seconds": time.perf_counter() - start}


def summarize(rows: list[dict], repeats: int) -> dict:
    flagged = sum(bool(r["flagged_by"]) for r in rows)
    shares = [r["fdp_share"] for r in rows if r["fdp_share"] is not None]
    seconds = [r["seconds"] for r in rows]
    goal = GOALS.get(rows[0]["mechanism"], {}) if rows else {}
    met = None
    if "flagged_at_most" in goal:
        met = flagged <= goal["flagged_at_most"] * repeats / 40
    elif "flagged_at_least" in goal:
        met = flagged >= goal["flagged_at_least"] * repeats / 40
    return {"audits": len(rows), "flagged": flagged,
            "flagged_by": dict(Counter(s for r in rows for s in r["flagged_by"])),
            "fdp_share_median": statistics.median(shares) if shares else None,
            "fdp_share_min": min(shares) if shares else None,
            "seconds_median": statistics.median(seconds) if seconds else None,
            "seconds_max": max(seconds) if seconds else None,
            "goal": goal, "goal_met_scaled_to_repeats": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--mechanisms", default="correct,reused_noise")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [m for m in args.mechanisms.split(",") if m]
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown:
        raise SystemExit(f"bench/audit_repeats.py: unknown mechanism(s) {unknown}; known: "
                         + ", ".join(MECHANISMS))
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    setup = setup_from_config(load_config(args.config), n=1000, coordinates=19_584,
                              canaries=16_000)
    out: dict[str, object] = {
        "setting": {"config": args.config, "n": 1000, "coordinates": 19_584,
                    "canaries": 16_000, "q": setup.q, "sigma": setup.sigma,
                    "rounds": setup.rounds, "certified_epsilon": setup.certified_epsilon},
        "repeats": args.repeats, "threads": args.threads,
        "loadavg_start": os.getloadavg()[0]}
    for name in names:
        rows = []
        for i in range(args.repeats):
            row = one(setup, name)
            rows.append(row)
            print(json.dumps({"i": i, **row}), file=sys.stderr, flush=True)
        out[name] = summarize(rows, args.repeats)
    out["wall_s"] = time.perf_counter() - start
    out["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
