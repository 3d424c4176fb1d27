"""The CPU study's results page: ``cpu-study.md`` (tables, figures) and ``cpu-study.json``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from dpgrpo.config.arms import CONTROL_ARM, FOCAL_ARM
from dpgrpo.config.json_types import JSONValue
from dpgrpo.release.files import certified_rounds

GB = 1e9


def _trained_part(model: Mapping[str, JSONValue]) -> str:
    """", training B only (FFA-LoRA)" and the like: what model.lora_train kept trainable."""
    train = model.get("lora_train", "all")
    words = {"B": ", training lora_B only (FFA-LoRA: lora_A frozen at its initialization)",
             "bias": ", training lora_B's bias only (one steering vector per module)"}
    start = f", warm start {model['init_adapter']}" if model.get("init_adapter") else ""
    return (
        words.get(train, "")
        + (", with lora_bias" if model.get("lora_bias") and train != "bias" else "")
        + start
    )


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}"


def _ci(ci: list[float] | None, digits: int = 1) -> str:
    return "n/a" if ci is None else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def _copy(src: Path, dst: Path, name: str) -> str | None:
    if not src.exists():
        return None
    shutil.copyfile(src, dst / name)
    return name


def write_results(results: Mapping[str, JSONValue], out: Path, *, figures: Path,
                  audits: Path) -> dict[str, Path]:
    """Write the results page, the JSON record and copies of the figures into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results = relative_paths(results, Path(results.get("out_dir") or figures.parent))
    pictures = [name for png in sorted(figures.glob("*.png"))
                if (name := _copy(png, out, f"cpu-study-{png.name}"))]
    _copy(figures / "predictions.json.gz", out, "cpu-study-predictions.json.gz")
    for which in ("leaky", "dp-leaky", "private"):
        if name := _copy(audits / f"{which}-mia" / "roc.png", out, f"cpu-study-roc-{which}.png"):
            pictures.append(name)
    record = {**results["summary"], "details": {k: v for k, v in results.items()
                                                 if k != "summary"}}
    (out / "cpu-study.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / "cpu-study.md").write_text(markdown(results, pictures))
    return {"json": out / "cpu-study.json", "md": out / "cpu-study.md"}


def relative_paths(obj: object, out_dir: Path) -> JSONValue:
    """``obj`` with every absolute path of this machine written relative: under the study's
    output folder relative to it (``warm-start/release``), else under the working folder
    relative to that; a committed page or record names no folder of the machine that ran it.
    Other strings are left as they are."""
    roots = [Path(out_dir).resolve(), Path.cwd().resolve()]

    def fix(x: object) -> object:
        if isinstance(x, Mapping):
            return {k: fix(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [fix(v) for v in x]
        if isinstance(x, str) and x.startswith("/"):
            path = Path(x)
            for root in roots:
                if path == root:
                    return "."
                if root in path.parents:
                    return str(path.relative_to(root))
        return x

    return fix(obj)


def _accuracy_rows(report: Mapping[str, JSONValue]) -> list[str]:
    rows = ["| model | strict accuracy (%) | mean tokens | cap rate (%) |",
            "| --- | ---: | ---: | ---: |"]
    for arm in report["arms"]:
        acc = arm["accuracy"].get("strict")
        rows.append(f"| {arm['name']} | {acc:.1f} | {arm['mean_tokens']:.1f} | "
                    f"{arm['cap_rate']:.1f} |")
    return rows


def _warm_start_lines(results: Mapping[str, JSONValue]) -> list[str]:
    """The public warm start's headline: what it gives alone, what DP-GRPO adds to it."""
    warm, s = results.get("warm_start"), results["summary"]
    if not warm:
        return []
    cert = warm["certificate"]
    what = ", ".join(f"{k} = {v}" for k, v in warm["overrides"].items())
    share = s.get("retained_share_over_warm_start")
    return [
        f"- Every trained arm starts from a **public warm start** "
        f"({what}; {certified_rounds(cert)} "
        f"rounds, sha256 {warm['sha256'][:12]}...): "
        f"alone it scores **{s['warm_start_accuracy']:.1f}%** "
        f"({_pp(s['warm_start_gain_pp'])} pp over the base"
        + (
            f", {100 * s['warm_start_share_of_dp_gain']:.0f}% of DP-GRPO's "
            f"{_pp(s['dp_gain_pp'])} pp over the base"
            if s.get("warm_start_share_of_dp_gain") is not None
            else ""
        )
        + f"). DP-GRPO over the warm start: "
        f"**{_pp(s['dp_vs_warm_start_pp'])} pp** {_ci(s['dp_vs_warm_start_ci'])}"
        f"{_over_runs(s, 'dp_vs_warm_start')}"
        + (
            f"; of what non-private GRPO adds to the warm start, DP-GRPO keeps {100 * share:.0f}%."
            if share is not None
            else "; non-private GRPO did not gain over the warm start here, so no share of its "
            "gain is defined."
        )
        + (
            f" The zero-advantage control against the same start: "
            f"{_pp(s['control_vs_warm_start_pp'])} pp {_ci(s['control_vs_warm_start_ci'])} "
            "(noise and the KL term alone)."
            if "control_vs_warm_start_pp" in s
            else ""
        )
        + " The warm start reads only public data (the study refuses one on its own "
        "training split); the arms' certificates cover what they add to it."
    ]


def markdown(results: Mapping[str, JSONValue], pictures: list[str]) -> str:
    """The results page."""
    s, plan = results["summary"], results["plan"]
    cfg, budget = plan["config"], plan["budget"]
    cert = results["dp_certificate"]
    lines = [
        "# CPU study: does DP-GRPO learn, and does the audit see leakage?", "",
        f"Regenerated by `{results.get('command') or 'dpgrpo study ' + results['config']}` "
        "(see the config for every setting "
        "and why it was chosen). SmolLM2-135M-Instruct on the embedded arithmetic task, "
        f"{plan['n_eval']} eval problems, greedy, strict scorer; "
        f"{_seeds(plan['settings']['seeds'])} of each private arm, "
        f"{_seeds(plan['settings'].get('non_private_seeds', 1))} of the non-private arm "
        "(accuracies averaged over seeds). Each headline interval is given twice: over "
        "problems (the seeds held fixed), and over seeds and problems (each arm's seeds "
        "resampled, then the problems), which counts how much training runs differ.", "",
        "## Headline", "",
        f"- Non-private GRPO over the base: **{_pp(s['nonprivate_gain_pp'])} pp** "
        f"{_ci(s['nonprivate_gain_ci'])}{_over_runs(s, 'nonprivate_gain')}"
        f"{_seed_spread(results['report'], 'non-private', 'base')}.",
        f"- DP-GRPO (epsilon {cert['epsilon']:.2f}) over the zero-advantage control: "
        f"**{_pp(s['dp_vs_control_pp'])} pp** {_ci(s['dp_vs_control_ci'])}"
        f"{_over_runs(s, 'dp_vs_control')}, MDE {s['dp_vs_control_mde']:.1f} pp"
        f"{_seed_spread(results['report'])}. DP-GRPO over the base: "
        f"{_pp(s['dp_gain_pp'])} pp.",
        *_few_seeds(s),
        *([(f"- DP-GRPO keeps **{100 * s['retained_share']:.0f}%** of the non-private gain "
            f"over the base ({_pp(s['dp_gain_pp'])} of {_pp(s['nonprivate_gain_pp'])} pp)"
            f"{_share_over_start(s)}, with "
            if s["retained_share"] <= 1 else
            f"- DP-GRPO gains **more** than non-private GRPO ({_pp(s['dp_gain_pp'])} against "
            f"{_pp(s['nonprivate_gain_pp'])} pp over the base, "
            f"{100 * s['retained_share']:.0f}%; the non-private arm is unstable here, see its "
            "per seed values), with ")
           + f"{s['trainable_params']:,} trainable coordinates and "
           f"{s['completions_per_arm']:,.0f} completions per trained arm (expected: m G T)."]
          if s.get("retained_share") is not None else []),
        *_warm_start_lines(results),
        f"- Noise-to-signal ratio sigma C sqrt(p) / (q n) / C = **{s['noise_to_signal']:.1f}** "
        f"(sigma {cert['sigma']:.4f}, p {cert['trainable_coordinates']:,} LoRA coordinates, "
        f"q n {cert['expected_batch']:g}; the paper's MATH point is about 8).",
        f"- DIBA on the leaky non-private run: AUC **{s['audit_leaky_auc']:.3f}** "
        f"{_ci(s['audit_leaky_auc_ci'], 3)}{_perm(s, 'audit_leaky_auc')}; on the DP-GRPO run "
        f"over the same members: AUC **{s['audit_dp_auc']:.3f}** "
        f"{_ci(s['audit_dp_auc_ci'], 3)}{_perm(s, 'audit_dp_auc')} (its certificate allows "
        f"at most {s['audit_dp_auc_ceiling']:.3f})"
        + (f"; on the leaky recipe under DP (certified epsilon "
           f"{results['dp_leaky_mia']['certified_epsilon']:.2f}): AUC "
           f"**{s['audit_dp_leaky_auc']:.3f}** {_ci(s['audit_dp_leaky_auc_ci'], 3)}"
           f"{_perm(s, 'audit_dp_leaky_auc')} (at most {s['audit_dp_leaky_auc_ceiling']:.3f})."
           if "audit_dp_leaky_auc" in s else ".")
        + (" The intervals are bootstrap intervals over the candidates; the permutation test "
           "(the whole cross-validated attack refitted on shuffled labels) also counts how the "
           "classifier was fitted, and its one-sided p-value is the test for leakage."
           + _sequential_note(s) if "audit_leaky_auc_p" in s else "")
        + _auc_side_notes(s, results),
        f"- Canary one-run lower bound **{s['canary_eps_lower_bound']:.3f}** beside the "
        f"certified epsilon {s['certified_eps']:.3f} of that run.",
        f"- Wall time {s['wall_seconds'] / 60:.1f} min on 2 CPU cores"
        f"{_without_sweep(s)}{_workers(results)}; peak RSS {s['peak_rss_bytes'] / GB:.2f} GB"
        f"{' per process' if results.get('workers', 1) > 1 else ''}.", "",
        "## Accuracy", "", *_accuracy_rows(results["report"]), "",
        f"Shared by the private arms: n = {budget['n']}, m = q n = {budget['m']:g}, T = "
        f"{budget['T']}, sigma = {budget['sigma']:.4f}, delta = {budget['delta']:.3g}, "
        f"C = {cfg['privacy']['clip_norm']}; G = {cfg['train']['group_size']}, cap "
        f"{cfg['train']['max_new_tokens']}, learning rate {cfg['train']['learning_rate']}, "
        f"LoRA rank {cfg['model']['lora_rank']} on {', '.join(cfg['model']['target_modules'])}"
        f" of layers {cfg['model']['lora_layers'] or 'all'}"
        f"{_trained_part(cfg['model'])}.", "",
        "## Contrasts (strict, paired bootstrap 95% CI, Holm-adjusted exact McNemar)", "",
        "The McNemar test is exact for one seed pair; with several seeds the Holm p shown is "
        "the largest over the seed pairs (each pair tested, Holm-adjusted in one family).", "",
        "| contrast | pp | 95% CI, problems | 95% CI, seeds and problems | seeds | MDE "
        "| Holm p (max over seeds) |", "| --- | ---: | --- | --- | --- | ---: | ---: |",
    ]
    shown = set()
    for row in _rows(results["report"]):
        if row["scorer"] != "strict" or (row["arm"], row["comparator"]) in shown:
            continue                          # dp-grpo - base is in both lists
        shown.add((row["arm"], row["comparator"]))
        holm = [p for p in row.get("holm_p") or [] if p is not None]
        mde = "" if row.get("mde") is None else f"{row['mde']:.1f}"
        seeds = "/".join(str(k) for k in row.get("n_seeds") or [])
        lines.append(f"| {row['arm']} - {row['comparator']} | {_pp(row['difference'])} | "
                     f"{_ci(row['ci'])} | {_ci(row.get('ci_runs'))} | {seeds} | {mde} | "
                     f"{f'{max(holm):.2g}' if holm else ''} |")
    if results["sweep"]:
        lines += ["", "## Epsilon sweep (DP-GRPO vs the same control)", "",
                  "| epsilon | sigma | noise/signal | DP-GRPO acc. (%) | vs control (pp) | 95% CI "
                  "| MDE |", "| ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        lines += [f"| {w['epsilon']:.1f} | refused before any round: {w['refused']} "
                  "| | | | | |" if "refused" in w else
                  f"| {w['epsilon']:.1f} | {w['sigma']:.4f} | {w['noise_to_signal']:.1f} | "
                  f"{w['accuracy']:.1f} | {_pp(w['dp_vs_control_pp'])} | "
                  f"{_ci(w['dp_vs_control_ci'])} | {w['mde']:.1f} |" for w in results["sweep"]]
    lines += ["", "## Audits", "", _audit_table(results), "",
              "## Steps (wall time and peak RSS)", "",
              "| step | seconds | peak RSS (GB) |", "| --- | ---: | ---: |"]
    lines += [f"| {r['step']} | {r['seconds']:.0f} | {r['peak_rss_bytes'] / GB:.2f} |"
              for r in results["steps"]]
    if pictures:
        lines += ["", "## Figures", ""] + [f"![{p}]({p})" for p in pictures]
    return "\n".join(lines) + "\n"


def _rows(report: Mapping[str, JSONValue]) -> list[Mapping[str, JSONValue]]:
    """Every contrast row of a comparison report (``versus_fixed``: none before it existed)."""
    return [*report["contrasts"], *report["versus_base"], *report.get("versus_fixed", [])]


def _perm(s: Mapping[str, JSONValue], key: str) -> str:
    """", permutation p = .., two-sided p = .. (L of at most n shuffles, null 95% [.., ..])"
    when the study ran the test (the upper tail's p: members score higher; the two-sided p
    only for a test that drew both tails; a record from before the sequential rule:
    "(null 95% [.., ..])")."""
    if f"{key}_p" not in s:
        return ""
    drawn = ""
    if f"{key}_draws" in s:
        n, h = s[f"{key}_permutations"], s.get(f"{key}_stop_after")
        drawn = (f"{n} shuffles, " if h is None else
                 f"{s[f'{key}_draws']} of at most {n} shuffles, stop at {h} >= observed; ")
    two = s.get(f"{key}_p_two_sided")
    both = "" if two is None else f", two-sided p = {two:.2g}"
    return (f", permutation p = {s[f'{key}_p']:.2g}{both} ({drawn}null 95% "
            f"{_ci(s[f'{key}_null'], 3)})")


#: The level of the permutation test that decides whether an audit shows a leak (one-sided,
#: fixed in advance, as the study's own text says).
LEAK_LEVEL = 0.05

_AUDITS = (("audit_leaky_auc", "leaky_mia", "the leaky run"),
           ("audit_dp_auc", "private_mia", "the DP-GRPO run"),
           ("audit_dp_leaky_auc", "dp_leaky_mia", "the leaky recipe under DP"))


def _auc_side_notes(s: Mapping[str, JSONValue], results: Mapping[str, JSONValue]) -> str:
    """A sentence for every DIBA AUC whose bootstrap interval excludes 0.5, on either side
    (issue 58): above, what it shows against the certificate's ceiling; below, what an AUC
    under 0.5 can mean and which test decides."""
    notes = []
    for key, record, what in _AUDITS:
        if key not in s:
            continue
        auc, (low, high) = s[key], s[f"{key}_ci"]
        test = (results.get(record) or {}).get("permutation") or {}
        two = test.get("p_value_two_sided")
        p2 = "" if two is None else f" (two-sided permutation p = {two:.2g})"
        if low > 0.5:
            ceiling = s.get(f"{key}_ceiling")
            one = test.get("p_value")
            if one is None or one <= LEAK_LEVEL:
                verdict = (f" On {what} the AUC's interval lies above 0.5{p2}: the attack "
                           "separates members")
            else:  # the interval leaves out the fitting; the permutation test decides
                both = "" if two is None else f", two-sided {two:.2g}"
                verdict = (
                    f" On {what} the AUC's bootstrap interval lies above 0.5, but the "
                    f"permutation test, which also counts the classifier's fitting, does not "
                    f"reject at {LEAK_LEVEL:g} (one-sided p = {one:.2g}{both}): no leak is shown")
            notes.append(
                verdict
                + ("" if ceiling is None else
                   f"; the certificate allows at most {ceiling:.3f}, and an AUC above that "
                   "would be a bug") + ".")
        elif high < 0.5:
            notes.append(
                f" On {what} the AUC's interval lies wholly below 0.5{p2}: the scores separate "
                f"members from non-members the other way round (flipped, AUC {1 - auc:.3f}). "
                "That is a signal, not a null result: either leakage that lowers members' DIBA "
                "scores, or members and non-members that are not exchangeable (a fixed split of "
                "the training file is not a random one). The bootstrap interval leaves out the "
                "classifier's fitting, whose cross-validated AUC sits below 0.5 without signal "
                "on a few dozen candidates (the permutation null's mean), so the two-sided "
                "permutation p-value, not the interval, is the test of either direction.")
    return "".join(notes)


def _sequential_note(s: Mapping[str, object]) -> str:
    """The stopping rule, when the study's permutation tests used it."""
    h = s.get("audit_leaky_auc_stop_after")
    if h is None:
        return ""
    return (f" Each test stops once {h} shuffles' AUCs reach the observed one, with "
            f"p = {h} / shuffles drawn, else draws all "
            f"{s['audit_leaky_auc_permutations']} (Besag and Clifford's sequential Monte Carlo "
            "p-value, Biometrika 1991: valid, and equal to the fixed test's for small p).")


def _seeds(n: int) -> str:
    return "one seed" if n == 1 else f"{n} seeds"


def _over_runs(s: Mapping[str, JSONValue], key: str) -> str:
    """" over problems; [..] over seeds and problems (Welch's t over seeds p = ..)" for a
    headline contrast with several seeds (nothing for a record without them)."""
    ci = s.get(f"{key}_ci_runs")
    if ci is None:
        return ""
    p = s.get(f"{key}_seed_p")
    return (f" over problems, **{_ci(ci)} over seeds and problems**"
            + (f" (Welch's t over seeds p = {p:.2g})" if p is not None else ""))


def _share_over_start(s: Mapping[str, JSONValue]) -> str:
    """" and X% of it over the common public warm start (which alone gives Y% ...)"."""
    share, alone = s.get("retained_share_over_warm_start"), s.get("warm_start_share_of_dp_gain")
    if "warm_start_accuracy" not in s:
        return ""
    over = (f" and **{100 * share:.0f}%** of its gain over the common public warm start"
            if share is not None else
            " (non-private GRPO did not gain over the common public warm start)")
    return over + (f"; the warm start alone gives {100 * alone:.0f}% of DP-GRPO's gain over "
                   "the base" if alone is not None else "")


def _few_seeds(s: Mapping[str, JSONValue]) -> list[str]:
    """A warning line when a headline claim rests on fewer than MIN_SEEDS_FOR_CLAIM seeds."""
    from dpgrpo.evaluation.stats import MIN_SEEDS_FOR_CLAIM

    seeds = [s[k] for k in ("nonprivate_gain_seeds", "dp_vs_control_seeds",
                            "dp_vs_warm_start_seeds") if s.get(k) is not None]
    if not seeds or min(seeds) >= MIN_SEEDS_FOR_CLAIM:
        return []
    return [f"- **Few runs.** These claims rest on {_seeds(min(seeds))} of an arm, fewer than "
            f"{MIN_SEEDS_FOR_CLAIM}: RL runs differ a lot from seed to seed, so read the "
            "intervals over seeds and problems, and rerun with `--seeds "
            f"{MIN_SEEDS_FOR_CLAIM}` or more before making the claim."]


def _seed_spread(report: Mapping[str, object], arm: str = FOCAL_ARM,
                 comparator: str = CONTROL_ARM) -> str:
    """Per-seed ``arm - comparator`` differences and their t-interval, with several seeds,
    labelled by the contrast they are seeds of."""
    row = next((r for r in _rows(report) if r["arm"] == arm
                and r["comparator"] == comparator and r["scorer"] == "strict"), None)
    seeds = (row or {}).get("seeds") or {}
    diffs = seeds.get("diffs") or []
    if len(diffs) < 2:
        return ""
    t = seeds.get("t_interval")
    return (f"; per seed of {arm} - {comparator}: {', '.join(_pp(d) for d in diffs)} pp"
            + (f" (t-interval over seeds {_ci(t)})" if t else ""))


def _without_sweep(s: Mapping[str, JSONValue]) -> str:
    rest = s.get("wall_seconds_without_sweep")
    return "" if rest is None or rest == s["wall_seconds"] else \
        f" ({rest / 60:.1f} min without the epsilon sweep)"


def _workers(results: Mapping[str, object]) -> str:
    n = results.get("workers", 1)
    return "" if n == 1 else (f", {n} worker processes running independent steps at once (the "
                              "steps' seconds overlap; the wall time is their union)")


def _ceiling(mia: Mapping[str, object]) -> str:
    value = mia.get("certified_auc_ceiling")
    return "" if value is None else f"{value:.3f}"


def _audit_table(results: Mapping[str, JSONValue]) -> str:
    rows = ["| run | attack | AUC (pooled OOF) | 95% CI | TPR@1%FPR | AUC ceiling of the "
            "certificate |", "| --- | --- | ---: | --- | ---: | ---: |"]
    runs = (("leaky non-private", "leaky_mia"), ("leaky recipe under DP", "dp_leaky_mia"),
            ("DP-GRPO", "private_mia"))
    leaky, split = results["leaky_mia"], results.get("audit_split")
    k = leaky["n_members"]
    if split:           # drawn at random (issue 58): the page names the draw, the json its ids
        pool = split["pool"]
        drawn = (f"Members: {k} of `{split['task']}` {split['split']}[{pool[0]}:{pool[1]}] drawn "
                 f"at random with {split['entropy']}; non-members: the other "
                 f"{leaky['n_nonmembers']} (positions and ids in cpu-study.json, "
                 "`details.audit_split`)")
    else:               # a study recorded before the split was drawn
        drawn = (f"Members: `{leaky['task']}` train[0:{k}]; non-members: train[{k}:"
                 f"{k + leaky['n_nonmembers']}]")
    rows[:0] = [drawn + " (the config's `[study.leaky]` and `[study.private_audit]` say how "
                "each audited run trained).", ""]
    for label, key in runs:
        mia = results.get(key)
        if not mia:
            continue
        pooled = mia["diba"]["pooled"]
        rows.append(f"| {label} | DIBA | {pooled['auc']:.3f} | "
                    f"{_ci([pooled['extra']['auc_ci_low'], pooled['extra']['auc_ci_high']], 3)} "
                    f"| {pooled['tpr_at_fpr']['0.01']:.3f} | {_ceiling(mia)} |")
        for b in mia.get("baselines", []):
            m = b.get("metrics")
            if m is None:
                continue
            extra = m.get("extra", {})
            rows.append(f"| {label} | {b['name']} | {m['auc']:.3f} | "
                        f"{_ci([extra.get('auc_ci_low', 0), extra.get('auc_ci_high', 0)], 3)} | "
                        f"{m['tpr_at_fpr']['0.01']:.3f} | |")
    c = results["canary"]
    rows += ["", "AUC ceiling: the largest AUC any membership test of one record can reach under "
             "the run's certificate (the trade-off curve of its privacy profile, "
             "`dpgrpo.privacy.tradeoff`; 1 for a run without noise). It bounds the game where "
             "each record is in with probability 1/2; the audit compares fixed members with "
             "other problems of the same split, which is that game only on average."]
    rows += ["", f"Canary audit of the DP-GRPO run: {c.get('m', '?')} canaries, "
             f"{c.get('v', '?')} of {c.get('r', '?')} guesses correct; empirical epsilon lower "
             f"bound {c['empirical_epsilon_lower_bound']:.3f} at {c.get('confidence', 0.95):.0%} "
             f"confidence, certified epsilon {c['certified_epsilon']:.3f}."]
    if results.get("whitebox"):
        rows += ["", _whitebox_sentence(results["whitebox"])]
    return "\n".join(rows)


def _whitebox_sentence(w: Mapping[str, JSONValue]) -> str:
    """The white-box mechanism audit's figures (docs/auditing.md says what they prove)."""
    s, cal = w["setup"], w.get("calibration") or {}
    a = w["analytic"]
    text = (f"White-box mechanism audit (model-free, {s['canaries']} gradient canaries in slots "
            f"of their own beside the run's, through the real sampler, mechanism and noise at "
            f"the DP-GRPO run's q, T, sigma and C; every round's update observed): one-run lower "
            f"bound {w['whitebox_bound']['epsilon_lower_bound']:.3f} at "
            f"{w['whitebox_bound']['confidence']:.0%} and delta' = "
            f"{a.get('bound_delta', s['delta']):.2g}, where the certificate claims epsilon "
            f"{a.get('certified_epsilon_at_bound_delta', w['certified_epsilon']):.3f} "
            f"(no count-based one-run bound, the f-DP "
            f"audit with the (epsilon, delta) curve included, could prove more than "
            f"{w['whitebox_bound'].get('count_ceiling', float('nan')):.3f} from the same "
            f"guesses; final model only: "
            f"{w['final_bound']['epsilon_lower_bound']:.3f}; the certified mechanism is expected "
            f"to reach {w['analytic'].get('design_median_bound', float('nan')):.3f}), one-shot "
            f"Gaussian fit mu {w['whitebox_fit']['mu']:.3f} (certificate: "
            f"{w['analytic']['statistic_mu']:.3f}), certified epsilon "
            f"{w['certified_epsilon']:.3f}.")
    f = w.get("fdp_bound")
    if f:                                # audits recorded since issue 58
        text += (f" The f-DP one-run bound (the {f['r']} most confident guesses, {f['u']} wrong, "
                 f"tested against the certified mechanism's trade-off family): "
                 f"{'at least ' if f.get('capped') else ''}{f['epsilon_lower_bound']:.3f} at "
                 f"delta' against the certificate's "
                 f"{a.get('certified_epsilon_at_bound_delta', float('nan')):.3f} "
                 f"({f['epsilon_at_run_delta']:.3f} at the run's delta against "
                 f"{w['certified_epsilon']:.3f}); the certified curve's p = "
                 f"{f['p_certified']:.2g}.")
    ind = w.get("independence")
    if ind:
        text += (" The rounds' noises: " + ("correlated, flagged by " + ", ".join(
            ind["flagged_by"]) if ind.get("flagged_by") else "independent (max |z| "
            f"{ind['consecutive_max_z']:.2f} between consecutive rounds)") + ".")
    if cal:
        text += (f" At q = 1 the measured mu is {cal['mu']:.3f} against the certified "
                 f"{cal['mu_certified']:.3f} and the noise scale {cal['noise_scale']:.3f}: "
                 f"{'FLAGGED' if cal['flagged'] else 'passed'}.")
    if "flagged_by" in w:
        text += (" Verdict: " + ("FLAGGED by " + ", ".join(w["flagged_by"])
                                 if w["flagged_by"] else "passed") + ".")
    return text


__all__ = ["markdown", "write_results"]
