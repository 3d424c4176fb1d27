"""Markdown tables: the comparison report (Tables II-V, XI) and the budget table (Table VI).

Numbers are percentages or percentage points (pp) with two decimals, intervals in brackets,
and an MDE beside every interval that contains zero (paper Section VII-E).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dpgrpo.errors import DataError
from dpgrpo.reports.comparison import Comparison, ContrastRow


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table; ``|`` in cells is escaped."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def fmt_p(p: float) -> str:
    """p-values: two significant digits, scientific below 0.001 (as Table XI)."""
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def fmt_contrast(row: ContrastRow) -> str:
    """``+2.65 [1.79, 3.51]``, with ``(MDE 0.73)`` when the interval contains zero."""
    c = row.result
    text = f"{c.difference:+.2f} [{c.ci[0]:.2f}, {c.ci[1]:.2f}]"
    return text + (f" (MDE {c.mde:.2f})" if c.mde is not None else "")


def _cells_by_scorer(rows: Sequence[ContrastRow], key: str, scorers: Sequence[str],
                     attr: str) -> list[str]:
    found = {r.scorer: r for r in rows if getattr(r, attr) == key}
    return [fmt_contrast(found[s]) if s in found else "–" for s in scorers]  # noqa: RUF001 - the report's typography


def accuracy_table(cmp: Comparison) -> str:
    """Accuracy of every arm under each scorer, change from the base in parentheses."""
    base = cmp.arm(cmp.base)
    rows = []
    for a in cmp.arms:
        cells = []
        for s in cmp.scorers:
            if s not in a.accuracy:
                cells.append("–")  # noqa: RUF001 - the report's typography
            elif a.name == cmp.base or s not in base.accuracy:
                cells.append(f"{a.accuracy[s]:.2f}")
            else:
                cells.append(f"{a.accuracy[s]:.2f} ({a.accuracy[s] - base.accuracy[s]:+.2f})")
        rows.append([a.name, str(len(a.seeds)), *cells])
    return markdown_table(["Arm", "Seeds", *(f"{s} (%)" for s in cmp.scorers)], rows)


def seed_accuracy_table(cmp: Comparison) -> str:
    """Per-seed accuracies (Table X)."""
    rows = [[a.name, s, " / ".join(str(x) for x in a.seeds),
             " / ".join(f"{x:.2f}" for x in a.seed_accuracy[s]), f"{a.accuracy[s]:.2f}"]
            for s in cmp.scorers for a in cmp.arms if s in a.accuracy]
    return markdown_table(["Arm", "Scorer", "Seeds", "Per seed (%)", "Mean (%)"], rows)


def gain_table(cmp: Comparison) -> str:
    """The focal arm's gain over each comparator (Table II), or each arm against the base."""
    if cmp.focal:
        names = list(dict.fromkeys(r.comparator for r in cmp.contrasts))
        rows = [[n, *_cells_by_scorer(cmp.contrasts, n, cmp.scorers, "comparator")]
                for n in names]
        return markdown_table(["Comparator", *(f"{s} (pp)" for s in cmp.scorers)], rows)
    return versus_base_table(cmp)


def versus_base_table(cmp: Comparison) -> str:
    """Every arm minus the base (the numbers of Fig. 2)."""
    names = list(dict.fromkeys(r.arm for r in cmp.versus_base))
    rows = [[n, *_cells_by_scorer(cmp.versus_base, n, cmp.scorers, "arm")] for n in names]
    return markdown_table(["Arm", *(f"{s} − {cmp.base} (pp)" for s in cmp.scorers)], rows)  # noqa: RUF001 - the report's typography


def versus_fixed_tables(cmp: Comparison) -> list[str]:
    """For each fixed arm (a public warm start), every other arm minus it: report sections."""
    out: list[str] = []
    for start in dict.fromkeys(r.comparator for r in cmp.versus_fixed):
        rows_ = [r for r in cmp.versus_fixed if r.comparator == start]
        names = list(dict.fromkeys(r.arm for r in rows_))
        table = markdown_table(["Arm", *(f"{s} − {start} (pp)" for s in cmp.scorers)],  # noqa: RUF001 - the report's typography
                               [[n, *_cells_by_scorer(rows_, n, cmp.scorers, "arm")]
                                for n in names])
        out += [f"## Each arm against `{start}` (a fixed starting model)", "", table, ""]
    return out


def tests_table(rows: Sequence[ContrastRow]) -> str:
    """Per-seed differences, seed sd and t interval, McNemar and Holm p, sign p (Table XI)."""
    out = []
    for r in rows:
        c, sd = r.result, r.result.seeds
        t_int = f"[{sd.t_interval[0]:.2f}, {sd.t_interval[1]:.2f}]" if sd.t_interval else "–"  # noqa: RUF001 - the report's typography
        out.append([
            f"{r.arm} − {r.comparator}", r.scorer, fmt_contrast(r),  # noqa: RUF001 - the report's typography
            " / ".join(f"{x:+.2f}" for x in sd.diffs), f"{sd.sd:.2f}" if sd.sd is not None else "–",  # noqa: RUF001 - the report's typography
            t_int, " / ".join(fmt_p(m.p) for m in c.mcnemar), fmt_p(max(c.holm_p)),
            fmt_p(c.sign_p)])
    return markdown_table(["Contrast", "Scorer", "Difference (pp)", "Per-seed difference (pp)",
                           "SD", "Seed t interval", "McNemar p", "Holm p, largest",
                           "Sign-rand. p"], out)


def length_table(cmp: Comparison) -> str:
    """Mean response length (tokens) and share of responses cut at the cap, per arm."""
    rows = [[a.name, f"{a.mean_tokens:.1f}", " / ".join(f"{x:.1f}" for x in a.seed_mean_tokens),
             f"{a.cap_rate:.2f}", " / ".join(f"{x:.2f}" for x in a.seed_cap_rate)]
            for a in cmp.arms]
    return markdown_table(["Arm", "Mean tokens", "Per seed", "Cap rate (%)", "Per seed (%)"],
                          rows)


def render_report(cmp: Comparison, figure_names: Sequence[str] = ()) -> str:
    """The whole ``report.md``."""
    st = cmp.settings
    focal = f"`{cmp.focal}` against every other arm" if cmp.focal else "every arm against the base"
    holm = ("all seed-pair tests of the contrasts table" if st.holm_family == "report"
            else "the seed-pair tests of each contrast")
    parts = [
        "# Comparison report", "",
        f"{cmp.n_problems} shared problems; base `{cmp.base}`; contrasts: {focal}; "
        f"scorers: {', '.join(cmp.scorers)}.", "",
        "Contrasts are paired differences in accuracy (pp); brackets give a "
        f"{100 * st.level:g}% problem-cluster bootstrap interval ({st.draws:,} draws, seeds "
        f"averaged within a problem, seed {st.seed}). McNemar tests are exact, one per seed pair, "
        f"Holm-adjusted within {holm}. Sign-randomization p uses {st.sign_draws:,} draws "
        f"(seed {st.seed}). Beside every interval containing 0: the two-sided "
        f"{100 * st.power:g}%-power MDE at alpha = {st.alpha:g}, "
        "MDE = (z_{1−α/2} + z_{power}) · SE, SE = sd(d_j)/√n over per-problem differences "  # noqa: RUF001 - the report's typography
        "(paper Section VII-E).", "",
        "## Accuracy", "", accuracy_table(cmp), "",
        "## Accuracy per seed", "", seed_accuracy_table(cmp), "",
    ]
    if cmp.focal:
        parts += [f"## {cmp.focal} gain over each comparator", "", gain_table(cmp), ""]
    parts += ["## Each arm against the base", "", versus_base_table(cmp), "",
              *versus_fixed_tables(cmp),
              "## Tests", "", tests_table(cmp.contrasts), "",
              "## Response length and cap rate", "", length_table(cmp), ""]
    if figure_names:
        parts += ["## Figures", ""] + [f"![{n}]({n})" for n in figure_names] + [""]
    return "\n".join(parts)


_KEYS = {"configuration": ("configuration", "name"), "n": ("n",), "m": ("m", "batch_size"),
         "sigma": ("sigma", "noise_multiplier"), "T": ("T", "rounds", "steps"),
         "pld": ("pld_epsilon", "pld"), "rdp": ("rdp_epsilon", "rdp"),
         "order": ("rdp_order", "order")}


def _get(row: Mapping[str, object], key: str, i: int) -> object:
    for k in _KEYS[key]:
        if row.get(k) is not None:
            return row[k]
    raise DataError(f"missing {' / '.join(_KEYS[key])}", line=i, field=_KEYS[key][0])


def _num(row: Mapping[str, object], key: str, i: int) -> float:
    value = _get(row, key, i) if key in _KEYS else row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        field = _KEYS[key][0] if key in _KEYS else key
        raise DataError(f"expected a number, got {value!r}", line=i, field=field)
    return float(value)


def privacy_budget_table(rows: Sequence[Mapping[str, object]]) -> str:
    """Table VI-style markdown: configuration, n, (m, σ, T), PLD ε, RDP ε (order) (App. A-F).

    Each row is a plain dict with ``configuration``, ``n``, ``m``, ``sigma``, ``T`` (or
    ``rounds``, or ``steps`` as dpgrpo 0.2.0 wrote it), ``pld_epsilon``, ``rdp_epsilon`` and
    optionally ``rdp_order`` and ``delta`` (a δ column is added when any row has one). Errors
    name the row (1-based) and field.
    """  # noqa: RUF002 - the report's typography
    body = []
    with_delta = any(r.get("delta") is not None for r in rows)
    for i, row in enumerate(rows, start=1):
        n, m, t = (int(_num(row, k, i)) for k in ("n", "m", "T"))
        sigma, pld = _num(row, "sigma", i), _num(row, "pld", i)
        rdp = f"{_num(row, 'rdp', i):.3f}"
        if any(row.get(k) is not None for k in _KEYS["order"]):
            rdp += f" ({_num(row, 'order', i):g})"
        cells = [str(_get(row, "configuration", i)), f"{n:,}", f"({m}, {sigma:.3f}, {t})",
                 f"{pld:.3f}", rdp]
        if with_delta:
            has = row.get("delta") is not None
            cells.insert(2, f"{_num(row, 'delta', i):.2e}" if has else "–")  # noqa: RUF001 - the report's typography
        body.append(cells)
    header = ["Configuration", "n", "(m, σ, T)", "PLD ε", "RDP ε (order)"]  # noqa: RUF001 - the report's typography
    if with_delta:
        header.insert(2, "δ")
    return markdown_table(header, body)
