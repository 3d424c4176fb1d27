"""The privacy budget of training configurations: Table VI of the paper (Appendix A-F).

For a RunConfig (a TOML file as ``dpgrpo train`` takes it) the budget is fixed by public
quantities alone (assumption A1): the number of slots n, the expected batch m = q n, the noise
multiplier sigma and the number of rounds T, at delta = ``privacy.delta`` or 1/(10 n). The loss,
clipping norm, learning rate, group size and verifier do not enter it (Corollary 2).

* n, q, delta and sigma come from :mod:`dpgrpo.privacy.budget`, the resolver the trainer
  uses: n = ``data.n_slots``, else ``data.limit`` + canaries, else the split's size (the
  embedded task, or the raw row count of the source file) + canaries; the split is loaded to
  count it (and to check n against the records), the model is not. sigma is
  ``privacy.noise_multiplier`` if set, else calibrated from ``privacy.epsilon``.
* a contributor-level configuration (``data.privacy_unit = "contributor"``, n =
  ``data.n_slots`` contributor slots, required) also gets a :class:`ContributorComparison`:
  what prompt-level DP on the same data (the same configuration with ``privacy_unit =
  "prompt"``) guarantees a contributor of k = ``data.per_contributor`` problems, by the
  accountant's group figure, at the same delta.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dpgrpo.config import RunConfig
from dpgrpo.config.json_types import JSON
from dpgrpo.errors import ConfigError, PrivacyBudgetError


@dataclass(frozen=True)
class BudgetRow:
    """One configuration's mechanism parameters and its certified budget (a Table VI row)."""

    configuration: str
    n: int
    m: float                       # expected prompts per round, q n
    sigma: float
    T: int
    delta: float
    q: float
    pld_epsilon: float             # reported (dp_accounting PLD, add-or-remove)
    rdp_epsilon: float             # cross-check, minimized over the RDP order grid
    rdp_order: float
    sigma_calibrated: bool         # True: sigma came from privacy.epsilon by bisection
    target_epsilon: float | None   # privacy.epsilon when sigma was calibrated
    unit: str = "prompt"           # data.privacy_unit: what n counts and epsilon protects
    contributor: ContributorComparison | None = None  # contributor-level rows only

    def to_dict(self) -> JSON:
        return asdict(self)


@dataclass(frozen=True)
class ContributorComparison:
    """One contributor with k problems, protected two ways on the same data, at one delta.

    ``contributor_epsilon``: contributor-level DP (this configuration: n contributor slots, at
    most k problems each per round, one clipped gradient per contributor). The prompt-level
    run of the same configuration (n problem slots, by the prompt rules without
    ``data.n_slots``, which counts contributors here; sigma given, or calibrated to the same
    privacy.epsilon at this delta) guarantees ``prompt_epsilon`` per problem and only
    ``group_epsilon`` to a contributor of k problems (the accountant's mixture-of-Gaussians group
    PLD, :mod:`dpgrpo.privacy.group`; a contributor with more problems fares worse still).
    """

    k: int
    delta: float
    contributor_epsilon: float
    prompt_n: int
    prompt_sigma: float
    prompt_epsilon: float
    group_epsilon: float
    group_method: str


def count_slots(config: RunConfig) -> int:
    """The public n a run of ``config`` uses (:func:`dpgrpo.tasks.splits.public_slots`, as
    the trainer counts it), without loading a model or writing a canary plan. Raises
    ConfigError if n is below the record count."""
    from dpgrpo.tasks.splits import public_slots

    return public_slots(config).count.n


def resolve_budget(config: RunConfig, name: str = "config", *, n: int | None = None,
                   cache: dict[tuple, Any] | None = None) -> BudgetRow:
    """The budget row of ``config``: n, delta, sigma (given or calibrated), PLD and RDP epsilon.

    ``n`` skips counting the slots when the caller already knows it. ``cache`` shares
    calibrations between configurations with the same (n, m, T, epsilon, delta).
    """
    from dpgrpo.privacy.accounting import epsilon_report
    from dpgrpo.privacy.budget import public_constants

    if not config.private:
        raise ConfigError(f"{name}: train.arm = 'non-private' has sigma = 0 and no privacy "
                          "budget to report")
    n = count_slots(config) if n is None else n
    cache = {} if cache is None else cache
    try:
        public = public_constants(config, n, cache=cache)
        sigma, delta, rounds = public.sigma, public.delta, public.rounds
        key = ("epsilon", n, public.expected_batch, rounds, sigma, delta)
        if key not in cache:
            cache[key] = epsilon_report(n, public.expected_batch, rounds, sigma, delta)
        report = cache[key]
    except (ConfigError, PrivacyBudgetError) as err:
        raise ConfigError(f"{name}: {err}") from None
    calibrated, p = public.sigma_calibrated, config.privacy
    row = BudgetRow(configuration=name, n=n, m=p.expected_batch, sigma=sigma, T=rounds,
                    delta=delta, q=report.q, pld_epsilon=report.epsilon,
                    rdp_epsilon=report.rdp_epsilon, rdp_order=report.rdp_order,
                    sigma_calibrated=calibrated,
                    target_epsilon=p.epsilon if calibrated else None,
                    unit=config.data.privacy_unit)
    if config.data.privacy_unit == "contributor":
        row = replace(row, contributor=compare_contributor(config, row, name, cache))
    return row


def compare_contributor(config: RunConfig, row: BudgetRow, name: str = "config",
                        cache: dict[tuple, Any] | None = None) -> ContributorComparison:
    """:class:`ContributorComparison` of a contributor-level configuration and its budget row."""
    from dpgrpo.privacy.accounting import RoundEvent
    from dpgrpo.privacy.neighbours import neighbour_figure

    data = replace(config.data, privacy_unit="prompt", contributors=None, n_slots=None)
    privacy = replace(config.privacy, delta=row.delta)  # calibrated (if so) at the same delta
    prompt = resolve_budget(replace(config, data=data, privacy=privacy),
                            f"{name} (prompt-level)", cache=cache)
    k = config.data.per_contributor
    figure = neighbour_figure([RoundEvent(prompt.q, prompt.sigma, prompt.T)], row.delta, group=k)
    return ContributorComparison(k=k, delta=row.delta, contributor_epsilon=row.pld_epsilon,
                                 prompt_n=prompt.n, prompt_sigma=prompt.sigma,
                                 prompt_epsilon=prompt.pld_epsilon, group_epsilon=figure.epsilon,
                                 group_method=figure.method)


def budget_rows(paths: Sequence[str | Path], overrides: Sequence[str] = ()) -> list[BudgetRow]:
    """Load each TOML config (with ``section.key=value`` overrides) and resolve its budget.

    A ``[protocol]`` table (see :mod:`dpgrpo.experiments.protocol`) is ignored; rows are named after
    the file stem. The arm is irrelevant to the budget, so a protocol file's arm does not matter; a
    ``non-private`` config raises ConfigError.
    """
    from dpgrpo.config import load_protocol_config

    if not paths:
        raise ConfigError("give at least one training config")

    cache: dict[tuple, object] = {}
    rows = []
    for path in paths:
        path = Path(path)
        config, _ = load_protocol_config(path, list(overrides))
        rows.append(resolve_budget(config, path.stem, cache=cache))
    return rows


def budget_table(rows: Sequence[BudgetRow]) -> str:
    """Table VI-style markdown of the rows (with a delta column), then, if any row is
    contributor-level, the contributor comparison (:func:`contributor_table`)."""
    from dpgrpo.reports.tables import privacy_budget_table

    table = privacy_budget_table([r.to_dict() for r in rows])
    compared = [r for r in rows if r.contributor is not None]
    return table + ("\n\n" + contributor_table(compared) if compared else "")


def contributor_table(rows: Sequence[BudgetRow]) -> str:
    """Markdown: per contributor-level row, epsilon per contributor under contributor-level DP
    beside prompt-level DP's epsilon per problem and for a contributor of k problems."""
    from dpgrpo.reports.tables import markdown_table

    body = []
    for row in rows:
        c = row.contributor
        if c is None:  # a prompt-level row: nothing to compare
            continue
        body.append([row.configuration, str(c.k), f"{c.delta:.2e}",
                     f"{row.n:,} ({row.m:g}, {row.sigma:.3f})", f"{c.contributor_epsilon:.3f}",
                     f"{c.prompt_n:,} ({row.m:g}, {c.prompt_sigma:.3f})",
                     f"{c.prompt_epsilon:.3f}", f"{c.group_epsilon:.3f}"])
    header = ["Configuration", "k", "δ", "contributor slots (m, σ)",  # noqa: RUF001 - the report's typography
              "ε per contributor (contributor-level)", "problem slots (m, σ)",  # noqa: RUF001 - the report's typography
              "ε per problem (prompt-level)", "ε for k problems (prompt-level, group)"]
    return markdown_table(header, body)


def write_budget_report(rows: Sequence[BudgetRow], out: str | Path, *,
                        as_json: bool = False) -> list[Path]:
    """Write the markdown table to ``out``; with ``as_json`` also the rows as a JSON list to
    ``out`` with the suffix ``.json``. Returns the paths written."""
    out = Path(out)
    if as_json and out.suffix == ".json":
        raise ConfigError(f"--out {out} receives the markdown table and the JSON rows go beside "
                          "it with the suffix .json; name the table e.g. budget.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    note = ("PLD: dp_accounting, add-or-remove-one, pessimistic connect-the-dots discretization; "
            "RDP: minimized over dp_accounting's order grid (order in parentheses). "
            "delta = privacy.delta or 1/(10 n).")
    if any(r.contributor is not None for r in rows):
        note += (
            " Contributor rows: n counts contributor slots and epsilon protects one "
            "contributor (at most k problems per round, one clipped gradient each). The "
            "prompt-level columns are the same configuration with data.privacy_unit = "
            "'prompt' (n = problem slots, by the prompt rules without data.n_slots; sigma "
            "given, or calibrated to the same epsilon), all at the contributor row's delta; "
            "its k-problem figure is the PLD accountant's "
            "group epsilon (mixture of Gaussians, Binomial(k, q))."
        )
    out.write_text(budget_table(rows) + "\n\n" + note + "\n", encoding="utf-8")
    written = [out]
    if as_json:
        rows_path = out.with_suffix(".json")
        rows_path.write_text(json.dumps([r.to_dict() for r in rows], indent=2) + "\n",
                             encoding="utf-8")
        written.append(rows_path)
    return written


__all__ = ["BudgetRow", "ContributorComparison", "budget_rows", "budget_table",
           "compare_contributor", "contributor_table", "count_slots", "resolve_budget",
           "write_budget_report"]
