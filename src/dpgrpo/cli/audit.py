"""CLI commands: ``dpgrpo audit mia`` (DIBA), ``dpgrpo audit canary`` (one-run bound) and
``dpgrpo audit mechanism`` (white-box gradient-canary audit of the mechanism).

Thin wrappers over :mod:`dpgrpo.audit.pipeline`, :mod:`dpgrpo.audit.report` and
:mod:`dpgrpo.audit.mechanism_audit`; library errors become one-line messages in
:func:`dpgrpo.cli.main`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from dpgrpo.audit.whitebox import AuditSetup

audit_app = typer.Typer(
    name="audit",
    no_args_is_help=True,
    help="Privacy audits: membership inference, canaries, the mechanism itself.",
)

_SAMPLES = typer.Option(8, "--samples", help="Responses sampled per prompt from each model.")
_TEMPERATURE = typer.Option(0.5, "--temperature", help="Sampling temperature of the attack.")
_MAX_NEW = typer.Option(None, "--max-new-tokens", help="Response cap (default: the task's).")
_SEED = typer.Option(0, "--seed", help="Seed of the sampler and the CV split (recorded).")
_TASK = typer.Option(None, "--task", help="Task whose verifier scores responses "
                                          "(default: the run's task).")
_DTYPE = typer.Option("float32", "--dtype", help="Model dtype: float32, bfloat16, float16.")
_DEVICE = typer.Option("cpu", "--device", help="Torch device, e.g. cpu or cuda.")
_BATCH = typer.Option(4, "--prompts-per-batch", help="Prompts per generate call.")
_DIBA = typer.Option(False, "--diba-sampling",
                     help="The attack paper's sampler: top-p 0.9, repetition penalty 1.05.")


def _settings(samples: int, temperature: float, max_new_tokens: int | None, batch: int,
              diba_sampling: bool = False):
    from dpgrpo.audit.scoring import DIBA_SAMPLING, SamplingSettings

    extra: dict[str, Any] = ({"top_p": DIBA_SAMPLING.top_p,
                              "repetition_penalty": DIBA_SAMPLING.repetition_penalty}
                             if diba_sampling else {})
    return SamplingSettings(n_samples=samples, temperature=temperature,
                            max_new_tokens=max_new_tokens, prompts_per_batch=batch, **extra)


@audit_app.command("mia")
def mia(
    run: Path = typer.Option(..., "--run", help="Run directory (with release/)."),
    members: str = typer.Option(..., "--members",
                                help="Members: JSONL file, TASK:SPLIT\\[a:b] or "
                                     "TASK:SPLIT\\[i,j,...]."),
    nonmembers: str = typer.Option(..., "--nonmembers",
                                   help="Non-members: JSONL file, TASK:SPLIT\\[a:b] or "
                                        "TASK:SPLIT\\[i,j,...]."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (not inside a release)."),
    task: str | None = _TASK,
    data_dir: Path | None = typer.Option(None, "--data-dir",
                                         help="Benchmark folder for split specs."),
    samples: int = _SAMPLES,
    temperature: float = _TEMPERATURE,
    max_new_tokens: int | None = _MAX_NEW,
    folds: int = typer.Option(5, "--folds", help="Stratified cross-validation folds."),
    trees: int = typer.Option(100, "--trees",
                              help="Random-forest trees in the stacking classifier."),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines",
                                   help="Also run LOSS, zlib, Min-K% and entropy baselines."),
    permutations: int = typer.Option(
        0, "--permutations", min=0,
        help="Label shuffles of a permutation test (the whole CV refitted each time; ~2 s "
             "each for 64 candidates): calibrates the AUC, whose bootstrap CI ignores how the "
             "classifier was fitted. 0: none."),
    stop_after: int = typer.Option(
        10, "--stop-after", min=0,  # dpgrpo.audit.sequential.DEFAULT_STOP_AFTER
        help="Besag & Clifford's sequential p-value (Biometrika 1991): stop the permutation "
             "test at the Nth shuffle whose AUC reaches the observed one (p = N / shuffles "
             "drawn); below N such shuffles in all --permutations, the fixed test's p. Small p "
             "are unchanged; without signal it stops early. 0, or N >= --permutations: the "
             "fixed test."),
    base_samples: Path | None = typer.Option(
        None, "--base-samples",
        help="JSON file of the base model's samples: read when it was drawn for these "
             "candidates, settings, seed and base (e.g. by the audit of another release of "
             "the same base), else drawn and written, so the next audit skips the base's half "
             "of the sampling."),
    seed: int = _SEED,
    prompts_per_batch: int = _BATCH,
    diba_sampling: bool = _DIBA,
    dtype: str = _DTYPE,
    device: str = _DEVICE,
) -> None:
    """DIBA membership inference on a release: JSON summary, markdown report, ROC figure."""
    from dpgrpo.audit.pipeline import run_mia
    from dpgrpo.audit.report import check_out_dir, write_mia_report
    from dpgrpo.audit.sequential import front_end_rule

    check_out_dir(out)
    from dpgrpo.cli._progress import say

    say(f"DIBA: loading the release and its base, sampling {samples} responses per candidate "
        "from each (minutes on a CPU) ...")
    outcome = run_mia(run, members, nonmembers, task=task, data_dir=data_dir,
                      settings=_settings(samples, temperature, max_new_tokens, prompts_per_batch,
                                         diba_sampling),
                      seed=seed, n_folds=folds, n_estimators=trees, baselines=baselines,
                      permutations=permutations,
                      stop_after=front_end_rule(permutations, stop_after),
                      base_samples=base_samples, dtype=dtype, device=device)
    paths = write_mia_report(out, outcome)
    m, pooled = outcome.result.unified.mean, outcome.result.unified.pooled
    typer.echo(f"DIBA: AUC {m.auc:.3f} (pooled {pooled.auc:.3f}, 95% CI "
               f"[{pooled.extra['auc_ci_low']:.3f}, {pooled.extra['auc_ci_high']:.3f}]), "
               f"balanced accuracy {m.balanced_accuracy:.3f}, "
               f"TPR@0.1%FPR {m.tpr_at_fpr['0.001']:.3f}, TPR@1%FPR {m.tpr_at_fpr['0.01']:.3f} "
               f"({outcome.labels.size} candidates, {folds}-fold CV, seed {seed})")
    if outcome.result.permutation is not None:
        from dpgrpo.audit.report import permutation_sentence

        typer.echo(permutation_sentence(outcome.result.permutation.to_dict()))
    if outcome.run.auc_ceiling is not None:
        typer.echo(f"the run's certificate allows a membership AUC of at most "
                   f"{outcome.run.auc_ceiling:.3f}")
    typer.echo(f"wrote {paths['summary.json']} and {paths['report.md']}")


@audit_app.command("canary")
def canary(
    run: Path = typer.Option(..., "--run",
                             help="Run directory (release/ and recovery/canaries.json)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (not inside a release)."),
    k_plus: int | None = typer.Option(None, "--k-plus",
                                      help="Canaries guessed 'in' (default m/10)."),
    k_minus: int | None = typer.Option(None, "--k-minus",
                                       help="Canaries guessed 'out' (default m/10)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the lower bound."),
    delta: float | None = typer.Option(None, "--delta", help="Delta (default: the certificate's)."),
    signal: str = typer.Option("gain+likelihood", "--signal",
                               help="Canary score: gain+likelihood or one DIBA feature."),
    task: str | None = _TASK,
    samples: int = _SAMPLES,
    temperature: float = _TEMPERATURE,
    max_new_tokens: int | None = _MAX_NEW,
    seed: int = _SEED,
    prompts_per_batch: int = _BATCH,
    diba_sampling: bool = _DIBA,
    dtype: str = _DTYPE,
    device: str = _DEVICE,
) -> None:
    """One-run empirical epsilon lower bound from the run's canaries, beside the certified one."""
    from dpgrpo.audit.pipeline import run_canary_audit
    from dpgrpo.audit.report import check_out_dir, write_canary_report

    check_out_dir(out)
    from dpgrpo.cli._progress import say

    say(f"canary audit: loading the release and its base, sampling {samples} responses per "
        "canary (minutes on a CPU) ...")
    outcome = run_canary_audit(
        run, k_plus=k_plus, k_minus=k_minus, confidence=confidence, delta=delta, signal=signal,
        task=task, settings=_settings(samples, temperature, max_new_tokens, prompts_per_batch,
                                      diba_sampling),
        seed=seed, dtype=dtype, device=device)
    paths = write_canary_report(out, outcome)
    a, cert = outcome.audit, outcome.run.epsilon
    typer.echo(f"empirical epsilon lower bound {a.epsilon_lower_bound:.3f} "
               f"({a.confidence:.0%} confidence, delta {a.delta:.3g}; {a.v} of {a.r} guesses "
               f"correct on {a.m} canaries) | certified epsilon "
               f"{'n/a' if cert is None else f'{cert:.3f}'}")
    typer.echo(f"wrote {paths['summary.json']} and {paths['report.md']}")


@audit_app.command("mechanism")
def mechanism(
    run: Path | None = typer.Option(
        None,
        "--run",
        help="Run directory: audit the mechanism "
        "with its release/certificate.json (n, q, T, sigma, C, d).",
    ),
    config: Path | None = typer.Argument(
        None,
        help="Or a run config (TOML): its n (data.n_slots or --n), q, T, C and calibrated sigma.",
    ),
    n: int | None = typer.Option(
        None, "--n", help="Public slot count with CONFIG (default its data.n_slots)."
    ),
    canaries: int | None = typer.Option(
        None,
        "--canaries",
        help="Gradient canaries K, in slots of their own beside the run's (default 16,000).",
    ),
    coordinates: int | None = typer.Option(
        None,
        "--coordinates",
        help="Trainable coordinates d simulated (default: the run's, "
        "raised to K when K exceeds it, as K orthonormal canaries "
        "need d >= K; with CONFIG max(K, 4096)).",
    ),
    mechanism_name: str = typer.Option(
        "correct",
        "--mechanism",
        help="correct, or a deliberately broken one to see the "
        "audit fail: half_sigma, no_clipping, "
        "half_coordinates, realized_batch, "
        "noise_per_prompt, reused_noise.",
    ),
    selection: str = typer.Option(
        "design",
        "--selection",
        help="How the white-box bound's guesses are fixed: design (in advance) or half.",
    ),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the bounds."),
    calibrate: bool = typer.Option(
        True, "--calibrate/--no-calibrate", help="Also run audit mode (q = 1), which can fail."
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Seed the canaries' bits and the "
        "model-free run (debugging only; default: OS entropy).",
    ),
    end_to_end: bool = typer.Option(
        False,
        "--end-to-end",
        help="With CONFIG: real rollouts "
        "and per-prompt gradients of its model and task beside the "
        "canaries, which take absent slots (data.n_slots).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Also write the JSON record to this file (never inside a release).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the full record as JSON."),
) -> None:
    """White-box audit of the mechanism with gradient canaries (model-free, or --end-to-end):
    count-based and f-DP one-run lower bounds, the rounds' noise independence, one-shot
    Gaussian estimate and analytic value beside the certified epsilon; exits non-zero when a
    statistic flags the mechanism (the verdict line names it)."""
    from dpgrpo.audit import mechanism_audit as ma

    overrides = {} if coordinates is None else {"coordinates": coordinates}
    if (run is None) == (config is None):
        raise typer.BadParameter("give exactly one of CONFIG or --run")
    if out is not None:
        from dpgrpo.audit.report import check_out_dir

        check_out_dir(out)
    if end_to_end:
        import tempfile

        from dpgrpo.config import load_config

        if config is None:
            raise typer.BadParameter("--end-to-end needs CONFIG")
        cfg = load_config(config)
        with tempfile.TemporaryDirectory(prefix="dpgrpo-audit-") as scratch:
            audit = ma.audit_end_to_end(cfg, Path(scratch), canaries=canaries or 1000,
                                        mechanism=mechanism_name, seed=seed,
                                        confidence=confidence, selection=selection,
                                        calibrate=calibrate)
        _report(audit, out, as_json)
        return
    if run is not None:
        cert = ma.read_certificate(run)
        setup = ma.setup_from_certificate(cert, canaries=canaries, **overrides)
        run_d = cert.get("trainable_coordinates")
    else:
        from dpgrpo.config import load_config

        setup = ma.setup_from_config(load_config(config), canaries=canaries, n=n, **overrides)
        run_d = None
    note = None if coordinates is not None else _dimension_note(setup, run_d)
    if not as_json:
        from dpgrpo.cli._progress import say

        say(f"auditing the {mechanism_name} mechanism: {setup.canaries:,} gradient canaries over "
            f"{setup.rounds} rounds (model-free)" + (", then audit mode (q = 1)" if calibrate
                                                    else "") + " ...")
    audit = ma.audit_mechanism(setup, mechanism_name, seed=seed, confidence=confidence,
                               selection=selection, calibrate=calibrate)
    _report(audit, out, as_json, note=note)


def _dimension_note(setup: AuditSetup, run_d: int | None) -> str | None:
    """The sentence that explains a simulated d other than the run's (None when they agree)."""
    d, k = setup.coordinates, setup.canaries
    if run_d is not None and int(run_d) == d:
        return None
    if run_d is not None:
        return (f"note: the run's certificate states d = {int(run_d):,} trainable coordinates; "
                f"the audit simulates d = {d:,} because its K = {k:,} orthonormal gradient "
                f"canaries need at least K coordinates (pass --canaries {int(run_d)} or fewer "
                f"to simulate the run's own d).")
    return (f"note: d = {d:,} is max(K, 4096), not a model's count: a config does not state the "
            "trainable coordinates (pass --coordinates, e.g. a run certificate's "
            "trainable_coordinates).")


def _report(audit, out: Path | None, as_json: bool,
            note: str | None = None) -> None:
    """Print (and write) the audit, then fail with MechanismAuditError if it flagged."""
    import json

    from dpgrpo.audit import mechanism_audit as ma

    if out is not None:
        from dpgrpo.rundir.atomic import atomic_write_text

        atomic_write_text(out, json.dumps(audit.to_dict(), indent=1) + "\n")
    typer.echo(json.dumps(audit.to_dict(), indent=1) if as_json else ma.summary_lines(audit))
    if note is not None and not as_json:
        typer.echo(note)
    ma.require_passed(audit)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` command group to the app."""
    app.add_typer(audit_app, name="audit")
