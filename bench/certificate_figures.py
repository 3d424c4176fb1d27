"""Time the certificate's replace-one and group figures against plain dp_accounting.

For the bare `dpgrpo train` (n 1000, m 2, T 12, checkpoint every 4) and the paper's MATH preset
(n 6988, m 128, T 50, checkpoint every 5): the figures of every checkpoint's certificate
(replace-one, groups k = 2, 3, at delta = 1/(10 n)) through dpgrpo's `neighbour_figures`
(vectorized mixture PLD, rounds cached across checkpoints) and, for the last checkpoint, through
dp_accounting's `PLDAccountant` on `MixtureOfGaussiansDpEvent` / REPLACE_ONE events. Prints the
times, the ratio, and the largest difference between the two sets of epsilons (expected 0).

    .venv/bin/python bench/certificate_figures.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant

from dpgrpo.privacy import group
from dpgrpo.privacy.accounting import RoundEvent, default_delta
from dpgrpo.privacy.calibration import calibrate
from dpgrpo.privacy.neighbours import neighbour_figures

CONFIGS = [  # name, n, m, T, checkpoint_every, sigma (None: calibrated to epsilon 8)
    ("bare dpgrpo train", 1000, 2.0, 12, 4, None),
    ("MATH preset", 6988, 128.0, 50, 5, 0.4842404738068581),
]


def reference(q: float, sigma: float, rounds: int, delta: float) -> list[float]:
    """Replace-one, then k = 2, 3, straight from dp_accounting's accountant."""
    acc = pld_privacy_accountant.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), rounds)
    out = [acc.get_epsilon(delta)]
    for k in (2, 3):
        acc = pld_privacy_accountant.PLDAccountant()
        acc.compose(group.mixture_event(sigma, k, q), rounds)
        out.append(acc.get_epsilon(delta))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    rows = []
    for name, n, m, rounds, every, sigma in CONFIGS:
        delta = default_delta(n)
        sigma = sigma or calibrate(n, m, rounds, 8.0, delta).sigma
        group.round_pld.cache_clear()
        times, figs = [], {}
        for done in range(every, rounds + 1, every):        # a certificate every `every` rounds
            start = time.perf_counter()
            figs = neighbour_figures([RoundEvent(m / n, sigma, done)], delta)
            times.append(time.perf_counter() - start)
        ours = [figs["replace_one"]["epsilon"]] + [g["epsilon"] for g in figs["group_privacy"]]
        start = time.perf_counter()
        ref = reference(m / n, sigma, rounds, delta)
        ref_time = time.perf_counter() - start
        rows.append({"config": name, "first_certificate_s": times[0],
                     "later_certificate_s": sum(times[1:]) / len(times[1:]),
                     "dp_accounting_s": ref_time, "speedup_first": ref_time / times[0],
                     "epsilons": dict(zip(("replace_one", "k2", "k3"), ours)),
                     "max_abs_difference": max(abs(a - b) for a, b in zip(ours, ref))})
    if parser.parse_args().json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['config']}: first certificate {r['first_certificate_s']:.1f} s, later "
              f"{r['later_certificate_s']:.1f} s; dp_accounting {r['dp_accounting_s']:.1f} s "
              f"({r['speedup_first']:.1f}x); epsilons {r['epsilons']}; "
              f"max |difference| {r['max_abs_difference']:.1e}")


if __name__ == "__main__":
    main()
