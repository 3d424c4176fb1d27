"""The CPU study's parts: its settings, its record of timed steps, and the steps themselves.

Each step trains, evaluates or audits one thing and returns a JSON-able dict; :class:`Steps`
times it (wall seconds, peak RSS) and skips it when a resumed study finds it done. The
orchestration is :mod:`dpgrpo.experiments.study`; the page's numbers,
:mod:`dpgrpo.experiments.study_summary`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, TypeVar

from dpgrpo.config import RunConfig, apply_overrides
from dpgrpo.config.arms import CONTROL_ARM, FOCAL_ARM
from dpgrpo.config.experiments import StudySettings
from dpgrpo.config.json_types import JSON, JSONValue
from dpgrpo.config.loading import override_text
from dpgrpo.errors import ConfigError, DataError, PrivacyError
from dpgrpo.privacy.planning import noise_to_signal
from dpgrpo.training.runtime import PeakRSS

if TYPE_CHECKING:
    from dpgrpo.audit.scoring import SamplingSettings
    from dpgrpo.experiments.protocol import ProtocolPlan

T = TypeVar("T")

Say = Callable[[str], None]
STUDY_JSON, STUDY_MD = "cpu-study.json", "cpu-study.md"
SWEEP_STEP = "sweep eps="          # the name of every sweep step starts so
SPLIT_JSON = "split.json"          # the audit's member/non-member split, in <out>/audit/
SPLIT_FORMAT = 1
WARM_START = "warm-start"          # the public warm start's folder and arm label


def _read_rows(path: Path) -> list[dict[str, object]]:
    return list(json.loads(path.read_text())) if path.exists() else []


def _best(rows: Sequence[JSON]) -> list[dict[str, object]]:
    best: dict[str, dict[str, object]] = {}
    for row in rows:
        if row["step"] not in best or row["seconds"] > best[row["step"]]["seconds"]:
            best[row["step"]] = row
    return list(best.values())


class Steps:
    """Wall time and peak RSS of each named step of the study.

    With ``record`` (a JSON file), each finished step is written there at once, and a step
    that a resumed study skips keeps the time and memory of the run that did its work (for each
    step name, the row with the most seconds), so an interrupted study still reports them.
    """

    def __init__(self, say: Say, record: Path | None = None, *,
                 others: Sequence[Path] = ()) -> None:
        self.say, self.record = say, record
        self._rows: list[JSON] = _read_rows(record) if record is not None else []
        self._others = [row for path in others for row in _read_rows(path)]
        self.started = time.perf_counter()

    @property
    def rows(self) -> list[JSON]:
        """For each step name, the row with the most seconds (the run that did its work),
        from this record and from the other workers' records."""
        return _best(self._rows + self._others)

    def run(self, name: str, fn: Callable[[], T]) -> T:
        self.say(f"{name} ...")
        start, t0 = time.time(), time.perf_counter()
        with PeakRSS(interval=0.05) as mem:
            out = fn()
        row = {"step": name, "seconds": round(time.perf_counter() - t0, 1),
               "peak_rss_bytes": mem.peak, "start": round(start, 1), "pid": os.getpid()}
        self._rows.append(row)
        if self.record is not None:
            from dpgrpo.rundir.checkpoint import atomic_write_json

            self.record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.record, _best(self._rows))
        self.say(f"{name}: {row['seconds']:.0f} s")
        return out

    @property
    def wall(self) -> float:
        """Seconds of study work: the length of the union of the steps' time spans, so steps
        run at once by several workers count once and a resumed study adds its steps' time;
        rows without a start time (older records) add their seconds."""
        return self.wall_of(lambda name: True)

    def wall_of(self, keep: Callable[[str], bool]) -> float:
        """:attr:`wall` of the steps whose name ``keep`` accepts."""
        rows = [r for r in self.rows if keep(r["step"])]
        spans = sorted((r["start"], r["start"] + r["seconds"]) for r in rows if "start" in r)
        total, end = sum(r["seconds"] for r in rows if "start" not in r), -math.inf
        for a, b in spans:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return round(total, 1)            # the rows hold tenths of a second


def override_list(table: Mapping[str, object]) -> list[str]:
    return [f"{k}={override_text(v)}" for k, v in table.items()]


def train_once(config: RunConfig, run_dir: Path) -> JSON:
    """Train (or resume, or skip when complete) one run; its certificate."""
    from dpgrpo.experiments.protocol import check_run_dir, release_complete
    from dpgrpo.rundir.layout import RunDir
    from dpgrpo.training.trainer import train

    check_run_dir(config, run_dir)   # a folder holding another run is refused, never resumed
    if not release_complete(run_dir, config.train.rounds):
        # recovery/config.json is written before round 1: rounds may have run even when both
        # journal files are gone, and only a resume charges them (rundir.resume's worst case)
        layout = RunDir(run_dir)
        resume = layout.has_charges() or layout.config_json.exists()
        train(None if resume else config, run_dir, resume=resume)
    return json.loads((run_dir / "release" / "certificate.json").read_text())


def _sampling(settings: StudySettings) -> SamplingSettings:
    from dpgrpo.audit.scoring import SamplingSettings

    return SamplingSettings(n_samples=settings.audit_samples,
                            temperature=settings.audit_temperature,
                            max_new_tokens=settings.audit_max_new_tokens,
                            prompts_per_batch=settings.audit_prompts_per_batch)


def draw_split(path: Path, members: int, config: RunConfig) -> JSON:
    """The DIBA audits' member/non-member split, drawn once and recorded in ``path``.

    The pool is the first ``2 members`` problems of ``config``'s split (public slots, chosen
    before any data is seen); ``members`` of them, drawn uniformly at random with the operating
    system's entropy (:func:`dpgrpo.privacy.sampling.read_entropy`), are the audited runs'
    training problems (``data.indices``), the rest the non-members, so the two are exchangeable
    before training. The record (positions and problem ids of both) is read back by
    :func:`read_split` when it exists: a resumed study keeps its split.
    """
    import numpy as np

    from dpgrpo.privacy import sampling
    from dpgrpo.rundir.checkpoint import atomic_write_json
    from dpgrpo.tasks import load_problems

    if path.exists():
        return read_split(path)
    data, pool = config.data, 2 * members
    problems = load_problems(data.task, data.split, data.data_dir, source=data.source)
    if len(problems) < pool:
        raise ConfigError(f"study.members = {members} needs a pool of {pool} problems; split "
                          f"{data.split!r} of {data.task!r} has {len(problems)}")
    rng = np.random.default_rng(int.from_bytes(sampling.read_entropy(32), "big"))
    order = [int(i) for i in rng.permutation(pool)]
    chosen, rest = sorted(order[:members]), sorted(order[members:])
    record = {"format": SPLIT_FORMAT, "task": data.task, "split": data.split,
              "pool": [0, pool], "entropy": "os.urandom",
              "members": chosen, "nonmembers": rest,
              "member_ids": [problems[i].id for i in chosen],
              "nonmember_ids": [problems[i].id for i in rest]}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    return record


def read_split(path: Path) -> JSON:
    """The split recorded by :func:`draw_split`, checked: members and non-members disjoint,
    within the pool, one id per position (DataError naming the file otherwise)."""
    if not path.exists():
        raise ConfigError(f"{path}: the study's member/non-member split is not drawn yet "
                          "(`dpgrpo study` draws it before the audited runs train)")
    record = json.loads(path.read_text())
    try:
        mem, non = [int(i) for i in record["members"]], [int(i) for i in record["nonmembers"]]
        lo, hi = record["pool"]
        ok = (record.get("format") == SPLIT_FORMAT and mem and non
              and not set(mem) & set(non) and len(set(mem)) == len(mem)
              and len(set(non)) == len(non) and all(lo <= i < hi for i in mem + non)
              and len(record["member_ids"]) == len(mem)
              and len(record["nonmember_ids"]) == len(non))
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError("not a valid member/non-member split (format 1: disjoint 'members' "
                        "and 'nonmembers' positions in 'pool', with their ids)", path=str(path))
    return dict(record)


def split_overrides(record: Mapping[str, JSONValue]) -> list[str]:
    """The overrides that make an audited run train on the split's members only."""
    return ["data.limit=none", "data.indices=" + ",".join(str(i) for i in record["members"])]


def _candidates(audits: Path, config: RunConfig) -> tuple[str, str]:
    """The audit's members and non-members of the run's task, as recorded in
    ``audits/split.json`` (:func:`draw_split`): split specs ``TASK:SPLIT[i,j,...]``."""
    record = read_split(audits / SPLIT_JSON)
    if (record["task"], record["split"]) != (config.data.task, config.data.split):
        raise ConfigError(f"{audits / SPLIT_JSON} was drawn from {record['task']!r} split "
                          f"{record['split']!r}; this run trains on {config.data.task!r} split "
                          f"{config.data.split!r}")
    if tuple(record["members"]) != config.data.indices:
        raise ConfigError(f"the audited run's data.indices are not the members recorded in "
                          f"{audits / SPLIT_JSON}")
    spec = f"{record['task']}:{record['split']}"
    return (f"{spec}[{','.join(map(str, record['members']))}]",
            f"{spec}[{','.join(map(str, record['nonmembers']))}]")


def base_samples_path(audits: Path, config: RunConfig) -> Path:
    """Where the DIBA audits of runs of ``config``'s base and task keep the base's samples."""
    import hashlib

    name = json.dumps([config.model.name, config.data.task, str(config.data.data_dir)])
    return audits / "base-samples" / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"


def draw_base_samples(audits: Path, settings: StudySettings, config: RunConfig) -> int:
    """Draw the base model's side of the DIBA audits of ``config``'s runs once
    (:func:`dpgrpo.audit.pipeline.base_samples`); the number of candidates."""
    from dpgrpo.audit.pipeline import base_samples

    members, nonmembers = _candidates(audits, config)
    return len(base_samples(base_samples_path(audits, config), config.model.name, members,
                            nonmembers, data_dir=config.data.data_dir,
                            settings=_sampling(settings), seed=settings.audit_seed))


def mia_audit(run_dir: Path, out: Path, settings: StudySettings, config: RunConfig) -> JSON:
    """DIBA and the baselines on the run's members against the non-members, both read from the
    study's recorded split (:func:`draw_split`, ``out.parent / split.json``), the base's
    samples read from (or drawn into) :func:`base_samples_path`."""
    from dpgrpo.audit.pipeline import run_mia
    from dpgrpo.audit.report import mia_summary, write_mia_report

    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        if "certified_auc_ceiling" not in summary:     # written before the ceiling existed
            from dpgrpo.audit.pipeline import read_run

            summary["certified_auc_ceiling"] = read_run(run_dir).auc_ceiling
        return summary
    members, nonmembers = _candidates(out.parent, config)
    outcome = run_mia(run_dir, members, nonmembers,
                      data_dir=config.data.data_dir, settings=_sampling(settings),
                      seed=settings.audit_seed, base_samples=base_samples_path(out.parent, config),
                      n_folds=settings.audit_folds)
    write_mia_report(out, outcome)
    return mia_summary(outcome)


def permutation_audit(out: Path, settings: StudySettings) -> dict[str, object] | None:
    """Add the permutation test (:func:`dpgrpo.audit.mia.permutation_test`) to the finished
    DIBA audit in ``out``, from the features it saved, stopped by Besag and Clifford's rule at
    ``study.audit_stop_after`` shuffles that reach the observed AUC; its summary, or None while
    the audit is not finished (the final pass then does it)."""
    import numpy as np

    from dpgrpo.audit.features import DIBA_FEATURES
    from dpgrpo.audit.mia import permutation_test
    from dpgrpo.audit.report import permutation_sentence
    from dpgrpo.audit.sequential import front_end_rule
    from dpgrpo.rundir.checkpoint import atomic_write_json

    summary_path, table = out / "summary.json", out / "candidates.jsonl"
    if not (summary_path.exists() and table.exists()):
        return None
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
    if "permutation" in summary or settings.audit_permutations < 1 or \
            len(rows) != summary["n_members"] + summary["n_nonmembers"]:  # still being written
        return summary
    x = np.array([[np.nan if r["features"][n] is None else r["features"][n]
                   for n in DIBA_FEATURES] for r in rows], dtype=np.float64)
    test = permutation_test(x, np.array([r["member"] for r in rows]),
                            permutations=settings.audit_permutations, seed=summary["seed"],
                            n_folds=summary["diba"]["n_folds"],
                            n_estimators=summary["diba"]["n_estimators"],
                            stop_after=front_end_rule(settings.audit_permutations,
                                                      settings.audit_stop_after))
    summary["permutation"] = test.to_dict()
    atomic_write_json(summary_path, summary)
    with (out / "report.md").open("a") as f:
        f.write("\n## Permutation test\n\n" + permutation_sentence(summary["permutation"]) + "\n")
    return summary


def canary_audit(run_dir: Path, out: Path, settings: StudySettings) -> JSON:
    from dpgrpo.audit.pipeline import run_canary_audit
    from dpgrpo.audit.report import canary_summary, write_canary_report

    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    outcome = run_canary_audit(run_dir, settings=_sampling(settings), seed=settings.audit_seed)
    write_canary_report(out, outcome)
    return canary_summary(outcome)


def whitebox_audit(cert: Mapping[str, object], out: Path) -> JSON:
    """The white-box mechanism audit (model-free, gradient canaries) at the DP-GRPO run's
    certificate: a check of the mechanism, which the canary and DIBA audits cannot be."""
    from dpgrpo.audit.mechanism_audit import audit_mechanism, setup_from_certificate
    from dpgrpo.rundir.checkpoint import atomic_write_json

    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    audit = audit_mechanism(setup_from_certificate(dict(cert)), calibrate=True).to_dict()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "summary.json", audit)
    return audit


def sweep_task(plan: ProtocolPlan, eps: float, steps: Steps) -> tuple[Path, JSON | str]:
    """Train and evaluate DP-GRPO at ``eps`` (sigma recalibrated, all else equal): its folder
    and certificate, or the reason it was refused."""
    from dpgrpo.experiments.protocol import eval_complete, evaluate

    base = next(r for r in plan.runs if r.arm == FOCAL_ARM)
    cfg = apply_overrides(base.config, ["privacy.noise_multiplier=none", f"privacy.epsilon={eps}"])
    run_dir = plan.out_dir / "sweep" / f"dp-grpo-eps{eps:g}"
    try:
        cert = steps.run(f"{SWEEP_STEP}{eps:g}: train", lambda: train_once(cfg, run_dir))
    except PrivacyError as err:  # e.g. the noise-tail gate: this epsilon cannot be certified
        return run_dir, str(err)
    if not eval_complete(run_dir / "eval", plan.n_eval):
        steps.run(f"{SWEEP_STEP}{eps:g}: evaluate", lambda: evaluate(
            plan, run_dir / "eval", adapter=run_dir / "release", arm=f"dp-grpo-eps{eps:g}",
            seed=1))
    return run_dir, cert


def sweep_point(plan: ProtocolPlan, eps: float, steps: Steps) -> JSON:
    """DP-GRPO at ``eps`` (:func:`sweep_task`) contrasted with the control."""
    from dpgrpo.evaluation import stats
    from dpgrpo.reports.inputs import load_arms

    control = next(r for r in plan.runs if r.arm == CONTROL_ARM)
    run_dir, cert = sweep_task(plan, eps, steps)
    if isinstance(cert, str):
        return {"epsilon": eps, "refused": cert}
    _, (a, b) = load_arms([run_dir / "eval", control.eval_dir], plan.base_dir)
    c = stats.contrast(a.correct["strict"], b.correct["strict"], draws=plan.settings.draws,
                       sign_draws=plan.settings.sign_draws)
    z = NormalDist().inv_cdf
    return {"epsilon": cert["epsilon"], "sigma": cert["sigma"], "dp_vs_control_pp": c.difference,
            "dp_vs_control_ci": list(c.ci), "mde": c.mde if c.mde is not None
            else (z(0.975) + z(0.8)) * c.se, "accuracy": c.accuracy_a,
            "noise_to_signal": noise_to_signal(cert["sigma"], cert["trainable_coordinates"],
                                               cert["expected_batch"])}


#: the names before issue 59 (tests and callers of an earlier dpgrpo import them)
_train_once, _whitebox = train_once, whitebox_audit


__all__ = ["SPLIT_JSON", "STUDY_JSON", "STUDY_MD", "SWEEP_STEP", "WARM_START", "Say", "Steps",
           "StudySettings", "canary_audit", "draw_base_samples", "draw_split", "mia_audit",
           "override_list", "permutation_audit", "read_split", "split_overrides", "sweep_point",
           "sweep_task", "train_once", "whitebox_audit"]
