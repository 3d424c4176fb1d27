"""PNG figures of a comparison (paper Fig. 2): every arm against the base, and per-seed points.

matplotlib is an extra (``pip install dpgrpo[plot]``); it is imported inside the functions and
used through ``Figure`` + the Agg canvas, so no global pyplot state is touched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrpo.errors import ConfigError
from dpgrpo.reports.comparison import Comparison

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _new_figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ConfigError("figures need matplotlib: pip install 'dpgrpo[plot]' "
                          "(or pass --no-figures)") from err
    fig = Figure(figsize=(width, height), dpi=150)
    FigureCanvasAgg(fig)
    return fig


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_versus_base(cmp: Comparison, scorer: str, path: Path) -> Path:
    """Each arm minus the base (pp): point, bootstrap interval and per-seed differences."""
    rows = [r for r in cmp.versus_base if r.scorer == scorer]
    fig = _new_figure(6.0, 1.0 + 0.5 * max(1, len(rows)))
    ax = fig.add_subplot()
    for y, r in enumerate(reversed(rows)):
        c = r.result
        ax.errorbar([c.difference], [y], xerr=[[c.difference - c.ci[0]], [c.ci[1] - c.difference]],
                    fmt="o", color="black", capsize=3, zorder=3)
        ax.scatter(c.seeds.diffs, [y + 0.18] * len(c.seeds.diffs), s=14, marker="o",
                   facecolors="none", edgecolors="tab:blue", zorder=2)
    ax.axvline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_yticks(range(len(rows)), [r.arm for r in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"{scorer} accuracy − {cmp.base} (pp); "  # noqa: RUF001 - the report's typography
                  f"{100 * cmp.settings.level:g}% bootstrap interval, circles: seeds")
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_per_seed(cmp: Comparison, scorer: str, path: Path) -> Path:
    """Accuracy (%) of every seed of every arm, arm means as ticks, the base as a line."""
    arms = [a for a in cmp.arms if scorer in a.accuracy and a.name != cmp.base]
    base = cmp.arm(cmp.base)
    fig = _new_figure(1.5 + 1.0 * max(1, len(arms)), 3.5)
    ax = fig.add_subplot()
    for x, a in enumerate(arms):
        ax.hlines(a.accuracy[scorer], x - 0.3, x + 0.3, color="black", lw=1.5, zorder=2)
        pts = a.seed_accuracy[scorer]
        offsets = [x + 0.4 * (i - (len(pts) - 1) / 2) / max(1, len(pts)) for i in range(len(pts))]
        ax.scatter(offsets, pts, s=16, color="tab:blue", zorder=3)
    if scorer in base.accuracy:
        ax.axhline(base.accuracy[scorer], color="black", lw=0.8, ls="--",
                   label=f"{cmp.base} {base.accuracy[scorer]:.2f}%")
        ax.legend(loc="lower right", fontsize=7)
    values = [v for a in arms for v in a.seed_accuracy[scorer]]
    values += [base.accuracy[scorer]] if scorer in base.accuracy else []
    if values:
        lo, hi = min(values), max(values)
        ax.set_ylim(lo - 0.2 * (hi - lo + 1), hi + 0.2 * (hi - lo + 1))
    ax.set_xticks(range(len(arms)), [a.name for a in arms], rotation=20, fontsize=8)
    ax.set_ylabel(f"{scorer} accuracy (%)")
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_figures(cmp: Comparison, out_dir: Path) -> list[Path]:
    """Both figures for every scorer: ``versus_base_<scorer>.png``, ``per_seed_<scorer>.png``."""
    out = []
    for s in cmp.scorers:
        if any(r.scorer == s for r in cmp.versus_base):
            out.append(plot_versus_base(cmp, s, Path(out_dir) / f"versus_base_{_safe(s)}.png"))
        out.append(plot_per_seed(cmp, s, Path(out_dir) / f"per_seed_{_safe(s)}.png"))
    return out
