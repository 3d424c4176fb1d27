"""Time dpgrpo's sigma calibration against dp_accounting's calibrate_dp_mechanism.

Same configurations (the paper's Table VII), same neighbouring relation and default
discretization; prints each time, the speed-up ratio and the relative difference in sigma.

calibrate_dp_mechanism's default tolerance is 1e-6 *absolute* in sigma, i.e. about 2e-6
relative at sigma ~ 0.5, too coarse to check agreement to 1e-6 relative; it runs here at
``tol = 1e-7`` (brentq converges superlinearly, so this costs it about one more evaluation).
dpgrpo certifies its sigma to 5e-7 relative (an exact evaluation on each side).

    .venv/bin/python bench/accounting.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant

from dpgrpo.privacy.accounting import default_delta
from dpgrpo.privacy.calibration import calibrate

CONFIGS = [  # name, n, m, T, target epsilon
    ("MATH eps=8", 6988, 128, 50, 8.0),
    ("GSM8K/CSQA eps=8", 6961, 128, 100, 8.0),
    ("MATH eps=1", 6988, 128, 50, 1.0),
]


def reference_sigma(n: int, m: int, rounds: int, epsilon: float) -> float:
    q, delta = m / n, default_delta(n)
    return dpa.calibrate_dp_mechanism(
        lambda: pld_privacy_accountant.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
        lambda s: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)),
                                          rounds),
        epsilon, delta, tol=1e-7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, n, m, rounds, eps in CONFIGS:
        t0 = time.perf_counter()
        ours = calibrate(n, m, rounds, eps)
        t1 = time.perf_counter()
        ref = reference_sigma(n, m, rounds, eps)
        t2 = time.perf_counter()
        rows.append({"config": name, "dpgrpo_s": t1 - t0, "dp_accounting_s": t2 - t1,
                     "speedup": (t2 - t1) / (t1 - t0), "sigma": ours.sigma, "reference_sigma": ref,
                     "relative_difference": abs(ours.sigma / ref - 1), "epsilon": ours.epsilon})
    total = {"speedup_total": (sum(r["dp_accounting_s"] for r in rows)
                               / sum(r["dpgrpo_s"] for r in rows)),
             "min_speedup": min(r["speedup"] for r in rows),
             "max_relative_difference": max(r["relative_difference"] for r in rows)}
    if args.json:
        print(json.dumps({"configs": rows, **total}))
        return
    print(f"{'config':18} {'dpgrpo s':>9} {'dp_acc s':>9} {'ratio':>6} {'sigma':>14} "
          f"{'rel diff':>9}")
    for r in rows:
        print(f"{r['config']:18} {r['dpgrpo_s']:9.2f} {r['dp_accounting_s']:9.2f} "
              f"{r['speedup']:6.1f} {r['sigma']:14.10f} {r['relative_difference']:9.1e}")
    print(f"total speed-up {total['speedup_total']:.1f}x (min {total['min_speedup']:.1f}x); "
          f"max relative sigma difference {total['max_relative_difference']:.1e}")


if __name__ == "__main__":
    main()
