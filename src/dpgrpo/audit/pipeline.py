"""End-to-end audits of a run directory: DIBA membership inference and the canary audit.

A run directory holds ``release/`` (the PEFT adapter, ``dpgrpo_config.json`` with the resolved
public config, ``certificate.json`` with the certified ``epsilon`` and ``delta``) and ``recovery/``
(private training state; the canary plan is ``recovery/canaries.json``). Both audits load the
release on its public base (:func:`dpgrpo.model.load_adapter`) and never read anything else
from the run except, for the canary audit, the secret inclusion bits needed to count correct
guesses.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpgrpo.audit.canary import CanaryPlan, canary_signal
from dpgrpo.audit.features import DIBA_FEATURES, feature_matrix
from dpgrpo.audit.mia import MIAResult, evaluate_diba, hardness_split
from dpgrpo.audit.one_run import OneRunResult, one_run_audit
from dpgrpo.audit.scoring import (
    SamplingSettings,
    base_rewards,
    base_seed,
    diba_feature_rows,
    gold_baseline_scores,
)
from dpgrpo.config.json_types import JSON
from dpgrpo.errors import ConfigError, DataError
from dpgrpo.rundir.layout import RunDir
from dpgrpo.tasks import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class RunInfo:
    """What the audit reads from a run directory (public release, plus the plan's path)."""

    run_dir: Path
    release_dir: Path
    model_name: str
    task_name: str | None
    epsilon: float | None
    delta: float | None
    config: dict = field(repr=False, default_factory=dict)
    ledger: dict | None = field(repr=False, default=None)

    @property
    def canary_plan_path(self) -> Path:
        return RunDir(self.run_dir).canaries

    @functools.cached_property
    def auc_ceiling(self) -> float | None:
        """The largest membership AUC the certificate's ledger allows
        (:func:`dpgrpo.privacy.tradeoff.auc_ceiling`; 1.0 for a non-private run); None
        without a ledger."""
        from dpgrpo.privacy.accounting import PrivacyLedger
        from dpgrpo.privacy.tradeoff import auc_ceiling

        if not self.ledger:
            return None
        return auc_ceiling(PrivacyLedger.from_dict(self.ledger).events)


def read_run(run_dir: str | Path) -> RunInfo:
    """Read ``release/dpgrpo_config.json`` (an old release's ``config.json``) and
    ``release/certificate.json`` (optional; DataError when present but unreadable)."""
    from dpgrpo.release.files import run_config

    layout = RunDir(run_dir)
    config = run_config(layout.root)  # the model folder of this machine, from recovery/
    model = config.get("model", {})
    name = model.get("name") if isinstance(model, dict) else model
    if not name:
        raise DataError("no model name", path=str(layout.public_config_path), field="model.name")
    data = config.get("data", {})
    task = config.get("task", {})
    task_name = task.get("name") if isinstance(task, dict) else task
    if not task_name and isinstance(data, dict):  # a dpgrpo training run: data.task
        task_name = data.get("task")
    cert = layout.certificate() if layout.certificate_path.exists() else {}
    if cert is None:
        raise DataError("unreadable certificate", path=str(layout.certificate_path))
    eps, delta = cert.get("epsilon"), cert.get("delta")
    return RunInfo(layout.root, layout.release, str(name), task_name,
                   None if eps is None else float(eps), None if delta is None else float(delta),
                   config, cert.get("ledger"))


_SPLIT_SPEC = re.compile(r"^(?P<task>[\w.-]+):(?P<split>[\w.-]+)"
                         r"(\[((?P<a>\d*):(?P<b>\d*)|(?P<list>\d+(,\d+)*))\])?$")


def _problem(row: dict, path: str, line: int) -> Problem:
    for key in ("id", "question", "answer"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise DataError("missing or not a non-empty string", path=path, line=line, field=key)
    choices = row.get("choices")
    return Problem(id=row["id"], question=row["question"], answer=row["answer"],
                   solution=row.get("solution"),
                   choices=None if choices is None else tuple(tuple(c) for c in choices))


def read_candidates(spec: str | Path, *, data_dir: str | Path | None = None
                    ) -> list[tuple[Problem, str | None]]:
    """Candidates as ``(problem, task name or None)`` from a JSONL file or a split spec.

    A JSONL file has one problem per line (``id``, ``question``, ``answer``, optional ``task``,
    ``solution``, ``choices``). A split spec ``TASK:SPLIT`` or ``TASK:SPLIT[a:b]`` loads that
    task split (from ``data_dir``) and keeps problems a..b-1; ``TASK:SPLIT[i,j,...]`` keeps the
    problems at those 0-based positions, in that order (as ``data.indices`` counts them).
    """
    path = Path(spec)
    if path.is_file():
        from dpgrpo.tasks.records import read_jsonl

        out = []
        for i, row in read_jsonl(path):
            if isinstance(row, DataError):
                raise row
            out.append((_problem(row, str(path), i), row.get("task")))
        return out
    match = _SPLIT_SPEC.match(str(spec))
    if match is None:
        raise ConfigError(f"{spec} is neither a JSONL file nor a TASK:SPLIT[a:b] or "
                          "TASK:SPLIT[i,j,...] spec")
    from dpgrpo.tasks import load_problems

    problems = load_problems(match["task"], match["split"], data_dir)
    if match["list"]:
        idx = [int(i) for i in match["list"].split(",")]
        past = [i for i in idx if i >= len(problems)]
        if past or len(set(idx)) != len(idx):
            raise ConfigError(f"{spec}: positions must be distinct and below the split's "
                              f"{len(problems)} problems" + (f" (got {past[:5]})" if past else ""))
        return [(problems[i], match["task"]) for i in idx]
    a = int(match["a"]) if match["a"] else None
    b = int(match["b"]) if match["b"] else None
    return [(p, match["task"]) for p in problems[a:b]]


def _resolve_tasks(candidates: Sequence[tuple[Problem, str | None]],
                   default: str | None) -> list[str]:
    names = []
    for problem, name in candidates:
        name = name or default
        if not name:
            raise ConfigError(f"candidate {problem.id} has no task: give --task or a 'task' field")
        names.append(name)
    return names


def _by_task(problems: Sequence[Problem], tasks: Sequence[str], fn) -> list[Any]:
    """Apply ``fn(task, problems)`` per task and put the per-problem results back in order."""
    from dpgrpo.tasks import get_task

    out: list[object] = [None] * len(problems)
    for name in dict.fromkeys(tasks):
        idx = [i for i, t in enumerate(tasks) if t == name]
        for i, value in zip(idx, fn(get_task(name), [problems[i] for i in idx])):
            out[i] = value
    return out


def _load_release(run: RunInfo, dtype: str, device: str):
    from dpgrpo.model import load_adapter

    return load_adapter(run.model_name, run.release_dir, dtype=dtype, device=device)


@dataclass(frozen=True)
class MIAOutcome:
    """A finished DIBA audit: the evaluation and the per-candidate table behind it."""

    run: RunInfo
    result: MIAResult
    ids: list[str]
    labels: np.ndarray
    features: np.ndarray
    subsets: np.ndarray
    baselines: dict[str, np.ndarray]
    settings: SamplingSettings
    seed: int


BASE_SAMPLES_FORMAT = "dpgrpo-diba-base-samples/1"


def _base_key(model_name: str, problems: Sequence[Problem], tasks: Sequence[str],
              settings: SamplingSettings, seed: int, dtype: str, device: str) -> JSON:
    """What the base model's samples are a function of; a saved file must match it all."""
    rows = [[p.id, t, p.question, p.answer] for p, t in zip(problems, tasks)]
    digest = hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()
    return {"model": model_name, "dtype": dtype, "device": device, "seed": int(seed),
            "settings": dataclasses.asdict(settings), "candidates": len(rows),
            "candidates_sha256": digest}


def _draw_base(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
               problems: Sequence[Problem], tasks: Sequence[str], settings: SamplingSettings,
               seed: int) -> list[list[float]]:
    generator = torch.Generator().manual_seed(base_seed(seed))
    return _by_task(problems, tasks, lambda t, ps: base_rewards(
        model, tokenizer, t, ps, settings=settings, generator=generator))


def _read_base(path: Path, key: Mapping[str, object]) -> list[list[float]] | None:
    """The saved base samples' rewards when ``path`` exists; ConfigError when they were drawn
    for something else (naming what), DataError when the file is unreadable."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        saved, rewards = data["key"], data["rewards"]
        if data.get("format") != BASE_SAMPLES_FORMAT or not isinstance(rewards, list):
            raise ValueError("not a base-samples file")
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"unreadable base samples ({err})", path=str(path)) from err
    for name, value in key.items():
        if saved.get(name) != value:
            raise ConfigError(f"{path}: these base samples were drawn for {name} = "
                              f"{saved.get(name)!r}, this audit has {value!r}; give another "
                              "file (or delete this one) to draw them again")
    return [[float(r) for r in row] for row in rewards]


def base_samples(path: str | Path, model_name: str, members: str | Path, nonmembers: str | Path,
                 *, task: str | None = None, data_dir: str | Path | None = None,
                 settings: SamplingSettings = SamplingSettings(), seed: int = 0,
                 dtype: str = "float32", device: str = "cpu") -> list[list[float]]:
    """The base model's side of a DIBA audit, drawn once into ``path`` (or read from it).

    DIBA compares each candidate's fine-tuned samples with the public base's. The base's
    samples draw from a stream of their own (:func:`dpgrpo.audit.scoring.base_seed`), so they
    are the same for every release of that base audited on the same candidates, settings and
    seed: :func:`run_mia` with ``base_samples=path`` reads them instead of sampling the base
    again (the same bits as sampling it in place; tested). The base is loaded on its own, with
    the adapter off, as inside an audit.
    """
    from dpgrpo.model import load_policy

    mem = read_candidates(members, data_dir=data_dir)
    non = read_candidates(nonmembers, data_dir=data_dir)
    problems = [p for p, _ in mem + non]
    tasks = _resolve_tasks(mem + non, task)
    key = _base_key(model_name, problems, tasks, settings, seed, dtype, device)
    saved = _read_base(Path(path), key)
    if saved is not None:
        return saved
    policy = load_policy(model_name, dtype=dtype, device=device)
    rewards = _draw_base(policy.model, policy.tokenizer, problems, tasks, settings, seed)
    _write_base(Path(path), key, [p.id for p in problems], rewards)
    return rewards


def _write_base(path: Path, key: Mapping[str, object], ids: list[str],
                rewards: list[list[float]]) -> None:
    from dpgrpo.rundir.atomic import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"format": BASE_SAMPLES_FORMAT, "key": key, "ids": ids,
                             "rewards": rewards})


def run_mia(run_dir: str | Path, members: str | Path, nonmembers: str | Path, *,
            task: str | None = None, data_dir: str | Path | None = None,
            settings: SamplingSettings = SamplingSettings(), seed: int = 0, n_folds: int = 5,
            n_estimators: int = 100, baselines: bool = True, permutations: int = 0,
            stop_after: int | None = None, base_samples: str | Path | None = None,
            dtype: str = "float32", device: str = "cpu") -> MIAOutcome:
    """DIBA on a released run: features for every candidate, stacking classifier, baselines.

    ``seed`` seeds the response sampler and the classifier's cross-validation and is recorded;
    ``permutations`` > 0 adds the permutation test (:func:`dpgrpo.audit.mia.permutation_test`),
    which with ``stop_after`` (1..permutations) stops by Besag and Clifford's sequential rule.
    ``base_samples``: a file of the base model's samples (:func:`base_samples`), read when it
    exists and was drawn for these candidates, settings, seed and base, else drawn and written.
    """
    run = read_run(run_dir)
    mem = read_candidates(members, data_dir=data_dir)
    non = read_candidates(nonmembers, data_dir=data_dir)
    problems = [p for p, _ in mem + non]
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise DataError("candidate ids must be unique across members and non-members")
    tasks = _resolve_tasks(mem + non, task or run.task_name)
    labels = np.array([1] * len(mem) + [0] * len(non))
    if min(len(mem), len(non)) < n_folds:
        raise ConfigError(f"{n_folds}-fold cross-validation needs at least {n_folds} members and "
                          f"{n_folds} non-members; got {len(mem)} and {len(non)}")
    if permutations and stop_after is not None and not 1 <= stop_after <= permutations:
        raise ConfigError(f"stop_after must be between 1 and the permutations ({permutations}), "
                          f"got {stop_after}")
    key = _base_key(run.model_name, problems, tasks, settings, seed, dtype, device)
    drawn = None if base_samples is None else _read_base(Path(base_samples), key)
    policy = _load_release(run, dtype, device)
    if drawn is None:
        drawn = _draw_base(policy.model, policy.tokenizer, problems, tasks, settings, seed)
        if base_samples is not None:
            _write_base(Path(base_samples), key, ids, drawn)
    generator = torch.Generator().manual_seed(seed)
    by_id = dict(zip(ids, drawn))
    rows = _by_task(problems, tasks, lambda t, ps: diba_feature_rows(
        policy.model, policy.tokenizer, t, ps, settings=settings, generator=generator,
        base=[by_id[p.id] for p in ps]))
    x = feature_matrix(rows, DIBA_FEATURES)
    base: dict[str, np.ndarray] = {}
    if baselines:
        per = _by_task(problems, tasks, lambda t, ps: _rows(gold_baseline_scores(
            policy.model, policy.tokenizer, t, ps, batch_size=settings.score_batch_size)))
        base = {k: np.array([r[k] for r in per]) for k in per[0]}
    result = evaluate_diba(x, labels, DIBA_FEATURES, baselines=base, n_folds=n_folds, seed=seed,
                           n_estimators=n_estimators, permutations=permutations,
                           stop_after=stop_after)
    subsets = hardness_split(x[:, 0], x[:, 1])
    return MIAOutcome(run, result, ids, labels, x, subsets, base, settings, seed)


def _rows(columns: dict[str, np.ndarray]) -> list[dict[str, float]]:
    n = len(next(iter(columns.values()))) if columns else 0
    return [{k: float(v[i]) for k, v in columns.items()} for i in range(n)]


@dataclass(frozen=True)
class CanaryOutcome:
    """A finished canary audit: the bound, the signal and the per-canary table."""

    run: RunInfo
    audit: OneRunResult
    signal: str
    ids: list[str]
    scores: np.ndarray
    features: np.ndarray
    included: np.ndarray
    settings: SamplingSettings
    seed: int


def default_k(m: int) -> int:
    """Default guesses per side, fixed before scoring: a tenth of the canaries (at least 1)."""
    return max(1, m // 10)


def run_canary_audit(run_dir: str | Path, *, k_plus: int | None = None,
                     k_minus: int | None = None, confidence: float = 0.95,
                     delta: float | None = None, signal: str = "gain+likelihood",
                     task: str | None = None, settings: SamplingSettings = SamplingSettings(),
                     seed: int = 0, dtype: str = "float32", device: str = "cpu") -> CanaryOutcome:
    """Score every canary of the run's plan from the release; one-run epsilon lower bound.

    ``delta`` defaults to the certificate's delta. ``k_plus`` and ``k_minus`` default to
    :func:`default_k` and must not be tuned on the outcome (see :mod:`dpgrpo.audit.one_run`).
    """
    run = read_run(run_dir)
    if not run.canary_plan_path.exists():
        raise DataError("no canary plan: this run was trained without canaries",
                        path=str(run.canary_plan_path))
    plan = CanaryPlan.load(run.canary_plan_path)
    delta = run.delta if delta is None else delta
    if delta is None:
        raise ConfigError("no delta: the run has no certificate.json; pass --delta")
    name = task or run.task_name
    if not name:
        raise ConfigError("the run's config names no task; pass --task")
    from dpgrpo.tasks import get_task

    m = len(plan.canaries)
    kp = default_k(m) if k_plus is None else k_plus
    km = default_k(m) if k_minus is None else k_minus
    if kp < 0 or km < 0 or kp + km > m:
        raise ConfigError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= {m} canaries, "
                          f"got {kp} and {km}")
    policy = _load_release(run, dtype, device)
    rows = diba_feature_rows(policy.model, policy.tokenizer, get_task(name), plan.canaries,
                             settings=settings, generator=torch.Generator().manual_seed(seed))
    x = feature_matrix(rows, DIBA_FEATURES)
    scores = canary_signal(x, DIBA_FEATURES, signal)
    audit = one_run_audit(scores, plan.included, k_plus=kp, k_minus=km, delta=delta,
                          confidence=confidence)
    return CanaryOutcome(run, audit, signal, [c.id for c in plan.canaries], scores, x,
                         np.array(plan.included), settings, seed)
