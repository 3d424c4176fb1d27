"""Choose hyper-parameters on a public proxy task, at the private run's budget (``dpgrpo tune``).

Tuning on the private data is not covered by the guarantee (Papernot & Steinke, ICLR 2022:
the choice itself leaks). So every grid point here is trained and scored on a PUBLIC proxy
task, under the private run's own mechanism: the same n (as public slots of the proxy), the
same epsilon and delta, T, and sigma calibrated for each point's m exactly as the private run
would calibrate it. Whatever this writes was computed from the proxy alone, so its privacy
cost is zero; the private run then uses the chosen point's settings.

The proxy must not be the private data: the training task's name (a generated task in any
folder) or data folder is refused, and so is a proxy with any question found in the private
training set by content (:mod:`dpgrpo.privacy.public_data`; that set is read only to compare).

Layout of the output folder OUT::

    OUT/tune.json           the grid: per point its overrides, p, sigma, noise-to-signal,
                            proxy accuracy; the chosen point; what was and was not read
    OUT/chosen.toml         the private config with the chosen point's overrides applied
    OUT/base/               the proxy's base evaluation
    OUT/points/<name>/      each point's runs, one per seed (runs/dp-grpo-seed<k>/ with
                            release/, recovery/, eval/), resumable

``tune.seeds`` (default 1) trains each point that many times, each run from its own OS entropy,
and scores the point by the mean of its runs' proxy accuracies: one run of a short DP-GRPO
schedule can be tens of points away from the next (docs/results/README.md), so one seed per
point can rank noise.

A rerun into OUT skips complete points and resumes interrupted ones (:func:`protocol.run_one`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrpo.config import RunConfig, apply_overrides, to_toml
from dpgrpo.config.arms import FOCAL_ARM
from dpgrpo.config.experiments import (
    DEFAULT_GRID,
    FIXED_KEYS,
    TUNABLE_PREFIXES,
    GridPoint,
    TuneSettings,
)
from dpgrpo.config.json_types import JSON, JSONValue
from dpgrpo.errors import ConfigError, PrivacyError

if TYPE_CHECKING:
    from dpgrpo.experiments.protocol import ProtocolPlan


def parse_grid(table: Mapping[str, object]) -> tuple[GridPoint, ...]:
    """A ``[tune.grid]`` table (point name -> list of overrides, or a table of key = value),
    each override checked against the run config's schema."""
    from dpgrpo.config.loading import grid_points

    return grid_points(dict(table))


def load_tune(path: str | Path, overrides: Sequence[str] = (), **options: object
              ) -> tuple[RunConfig, TuneSettings]:
    """The private config (its ``[tune]``, ``[protocol]`` and ``[study]`` tables stripped) and
    the tune settings: CLI ``options`` (None = not given) over the ``[tune]`` table, read by the
    config's one strict loader (:func:`dpgrpo.config.loading.load_tune_table`)."""
    from dpgrpo.config import config_from_dict, read_toml
    from dpgrpo.config.loading import load_tune_table, split_tables

    data = read_toml(path)
    tables = split_tables(data, source=str(path))
    config = apply_overrides(config_from_dict(data, source=str(path)), list(overrides))
    table = dict(tables.get("tune", {}))
    if "eval_batch_size" not in table and options.get("eval_batch_size") is None:
        table["eval_batch_size"] = tables.get("protocol", {}).get("eval_batch_size", 25)
    return config, load_tune_table(table, source=str(path), **options)


def private_slots(config: RunConfig) -> int:
    """The private run's public n, fixed WITHOUT reading its data: ``data.n_slots``, else
    ``data.limit`` + canaries, else the size of a task generated offline. A data file's row
    count would have to be read from the private file, so it is refused."""
    from dpgrpo.tasks import get_task

    data, k = config.data, config.audit.canaries
    if data.n_slots is not None:
        return data.n_slots
    if data.capacity is not None:          # data.indices or data.limit
        return data.capacity + k
    task = get_task(data.task)
    if task.needs_data_dir:
        raise ConfigError(f"tune fixes n without reading the private data: task {data.task!r} "
                          "reads a file, so set data.n_slots (or data.limit) in the config")
    from dpgrpo.tasks import load_split

    return len(load_split(task, data.split, None).problems) + k  # generated: no file opened


def check_proxy(config: RunConfig, settings: TuneSettings) -> None:
    """Refuse a proxy that is, or holds, the private training data (PrivacyError).

    By name: the private task itself (for a generated task any data folder gives the same
    problems), or the private run's data folder. By content: any question of the proxy's train
    or eval split that is in the private training set by the public rule of
    :mod:`dpgrpo.privacy.public_data` (PublicDataError, with the count and two examples)."""
    from dpgrpo.privacy.public_data import check_disjoint
    from dpgrpo.tasks import get_task
    from dpgrpo.tasks.splits import split_questions, training_questions

    proxy = get_task(settings.proxy)
    same_dir = (settings.proxy_data_dir is not None and config.data.data_dir is not None
                and Path(settings.proxy_data_dir).resolve() == Path(config.data.data_dir).resolve())
    same_task = settings.proxy == config.data.task and (
        not proxy.needs_data_dir or settings.proxy_data_dir is None or same_dir)
    if same_dir or same_task:
        where = (f"reads {settings.proxy_data_dir or config.data.data_dir}"
                 if proxy.needs_data_dir else "is the private run's own (generated) task")
        raise PrivacyError(
            f"proxy {settings.proxy!r} {where}: that is the private run's own data, and "
            "choosing settings on it is not covered by the guarantee; give a public proxy "
            "(another task or another --proxy-data-dir)")
    private = training_questions(config)  # read only to compare; nothing from it is written
    for split in dict.fromkeys(("train", settings.eval_split)):
        check_disjoint(split_questions(settings.proxy, split, settings.proxy_data_dir),
                       private, what=f"proxy {settings.proxy!r}, split {split!r}",
                       against=f"the private training set ({config.data.task!r}, split "
                               f"{config.data.split!r})")


def proxy_config(config: RunConfig, settings: TuneSettings, point: GridPoint, n: int
                 ) -> RunConfig:
    """The private config moved onto the proxy: the proxy's train split (its first n problems if
    it holds more) in n public slots (the private run's n, so q = m / n is the same), no
    canaries, the point's overrides, the arm DP-GRPO and sigma left to calibration from the same
    epsilon and delta."""
    from dpgrpo.tasks import load_split

    size = len(load_split(settings.proxy, "train", settings.proxy_data_dir).problems)  # public
    data = replace(config.data, task=settings.proxy, data_dir=settings.proxy_data_dir,
                   split="train", limit=n if size > n else None, n_slots=n, skip_invalid=False,
                   privacy_unit="prompt", contributors=None)
    delta = config.privacy.delta if config.privacy.delta is not None else 1.0 / (10 * n)
    privacy = replace(config.privacy, delta=delta, noise_multiplier=None)
    cfg = replace(config, data=data, privacy=privacy, audit=replace(config.audit, canaries=0),
                  train=replace(config.train, arm=FOCAL_ARM))
    return apply_overrides(cfg, list(point.overrides))


@dataclass(frozen=True)
class PointResult:
    """A grid point's budget, size and score on the proxy."""

    name: str
    overrides: tuple[str, ...]
    expected_batch: float
    sigma: float
    trainable_params: int
    noise_to_signal: float
    completions: int
    accuracy: float | None      # proxy eval accuracy (strict): the mean over its runs
    epsilon: float | None       # the proxy runs' certified epsilon (= the private target)
    accuracies: tuple[float, ...] = ()   # each run's proxy accuracy, seed 1 first


def _point_dirs(out: Path, point: GridPoint) -> Path:
    return out / "points" / point.name


def plan_point(config: RunConfig, settings: TuneSettings, point: GridPoint, out: Path,
               n: int) -> ProtocolPlan:
    """The point's protocol plan (DP-GRPO only, ``settings.seeds`` runs, no figures) on the
    proxy."""
    from dpgrpo.experiments.protocol import ProtocolSettings, plan_protocol

    cfg = proxy_config(config, settings, point, n)
    st = ProtocolSettings(seeds=settings.seeds, arms=(FOCAL_ARM,), eval_split=settings.eval_split,
                          eval_limit=settings.eval_limit,
                          eval_batch_size=settings.eval_batch_size, figures=False)
    return plan_protocol(cfg, st, _point_dirs(out, point))


def _run_point(config: RunConfig, settings: TuneSettings, point: GridPoint, out: Path,
               n: int, seed: int = 1) -> JSON:
    """Train and score run ``seed`` (1-based) of ``point``."""
    from dpgrpo.experiments.protocol import check_existing, run_one
    from dpgrpo.rundir.layout import RunDir

    plan = plan_point(config, settings, point, out, n)
    spec = plan.runs[seed - 1]
    check_existing(spec)
    _, summary = run_one(plan, spec)
    cert = RunDir(spec.run_dir).certificate() or {}
    return {"accuracy": summary["accuracy"]["strict"], "epsilon": cert.get("epsilon"),
            "trainable_params": cert.get("trainable_coordinates"), "sigma": plan.budget.sigma}


def _run_base(config: RunConfig, settings: TuneSettings, out: Path, n: int) -> JSON:
    from dpgrpo.experiments.protocol import BASE_ARM, evaluate

    plan = plan_point(config, settings, settings.grid[0], out, n)
    summary = evaluate(plan, out / "base", adapter=None, arm=BASE_ARM, seed=None)
    return {"accuracy": summary["accuracy"]["strict"]}


def _worker(config: Mapping[str, object], settings: Mapping[str, object], what: str, out: str,
            n: int, threads: int) -> dict[str, object]:
    """One task in a spawned worker (only public values cross)."""
    import torch

    from dpgrpo.config import config_from_dict

    torch.set_num_threads(threads)
    cfg = config_from_dict(config)
    st = _settings_from_dict(settings)
    if what == "base":
        return _run_base(cfg, st, Path(out), n)
    name, seed = _task_point(what)
    point, = [p for p in st.grid if p.name == name]
    return _run_point(cfg, st, point, Path(out), n, seed)


def _tasks(settings: TuneSettings) -> list[str]:
    """The pool's tasks: the proxy's base evaluation, then every point's runs, seed 1 of every
    point first (so an interrupted tune has one run of each point before any second run)."""
    return ["base", *(f"{p.name}#{k}" for k in range(1, settings.seeds + 1)
                      for p in settings.grid)]


def _task_point(task: str) -> tuple[str, int]:
    name, _, seed = task.rpartition("#")
    return name, int(seed)


def _settings_from_dict(data: Mapping[str, JSONValue]) -> TuneSettings:
    grid = tuple(GridPoint(p["name"], tuple(p["overrides"])) for p in data["grid"])
    return TuneSettings(**{**data, "grid": grid})


def _config_dict(config: RunConfig) -> JSON:
    data = config.to_dict(public=False)
    return {section: {k: v for k, v in values.items() if v is not None}
            for section, values in data.items()}


def _run_all(config: RunConfig, settings: TuneSettings, out: Path, n: int,
             say: Callable[[str], None]) -> dict[str, JSON]:
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    tasks = _tasks(settings)
    if settings.workers == 1:
        results = {}
        for name in tasks:
            say(f"{name} ...")
            if name == "base":
                results[name] = _run_base(config, settings, out, n)
                continue
            point_name, seed = _task_point(name)
            point, = [p for p in settings.grid if p.name == point_name]
            results[name] = _run_point(config, settings, point, out, n, seed)
        return results
    workers = min(settings.workers, len(tasks))
    threads = max(1, (os.cpu_count() or 1) // workers)
    say(f"{len(tasks)} tasks on {workers} workers, {threads} thread(s) each")
    args = (_config_dict(config), asdict(settings))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_worker, *args, name, str(out), n, threads)
                   for name in tasks}
        results = {}
        for name, future in futures.items():
            results[name] = future.result()
            say(f"{name}: done")
    return results


@dataclass(frozen=True)
class TuneResult:
    out_dir: Path
    base_accuracy: float
    points: tuple[PointResult, ...]
    chosen: str
    chosen_config: Path
    report: JSON


def run_tune(config: RunConfig, settings: TuneSettings, out_dir: str | Path, *,
             progress: Callable[[str], None] | None = None) -> TuneResult:
    """Train and score every grid point on the proxy; choose the best proxy accuracy (ties:
    the earlier point); write ``tune.json`` and ``chosen.toml``. The private data is read only by
    :func:`check_proxy`'s comparison, before any run."""
    from dpgrpo.rundir.atomic import atomic_write_json, atomic_write_text
    from dpgrpo.rundir.lock import RunLock

    say = progress or (lambda message: None)
    out = Path(out_dir).resolve()
    check_proxy(config, settings)
    n = private_slots(config)
    for point in settings.grid:  # every point's config is valid before any work
        proxy_config(config, settings, point, n)
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out, what="tune folder"):
        results = _run_all(config, settings, out, n, say)
    base = float(results["base"]["accuracy"])
    points = tuple(_point_result(config, settings, p, n,
                                 [results[f"{p.name}#{k}"] for k in range(1, settings.seeds + 1)])
                   for p in settings.grid)
    best = max(points, key=lambda r: (r.accuracy if r.accuracy is not None else -math.inf,
                                      -points.index(r)))
    chosen_cfg = apply_overrides(config, list(best.overrides))
    chosen_path = out / "chosen.toml"
    atomic_write_text(chosen_path, _chosen_header(settings, best) + to_toml(chosen_cfg))
    report = {"proxy": settings.proxy, "proxy_data_dir": settings.proxy_data_dir,
              "eval_split": settings.eval_split, "private_task": config.data.task,
              "n": n, "epsilon": config.privacy.epsilon, "rounds": config.train.rounds,
              "seeds": settings.seeds,
              "base_accuracy": base, "chosen": best.name,
              "chosen_overrides": list(best.overrides),
              "privacy_cost": "zero: every run trained and scored on the public proxy, "
                              "which shares no question with the private training set "
                              "(compared by content before any run); n came from the config",
              "points": [asdict(p) for p in points]}
    atomic_write_json(out / "tune.json", report)
    return TuneResult(out, base, points, best.name, chosen_path, report)


def _point_result(config: RunConfig, settings: TuneSettings, point: GridPoint, n: int,
                  runs: Sequence[Mapping[str, JSONValue]]) -> PointResult:
    """A point's figures from its runs (they share p, sigma and epsilon: one plan)."""
    from dpgrpo.privacy.planning import noise_to_signal

    found = runs[0]
    cfg = proxy_config(config, settings, point, n)
    p, m, sigma = int(found["trainable_params"]), cfg.privacy.expected_batch, float(found["sigma"])
    accuracies = tuple(float(r["accuracy"]) for r in runs)
    return PointResult(name=point.name, overrides=point.overrides, expected_batch=m,
                       sigma=sigma, trainable_params=p,
                       noise_to_signal=noise_to_signal(sigma, p, m),
                       completions=int(round(m * cfg.train.group_size * cfg.train.rounds)),  # noqa: RUF046 - round() of a numpy float is a float before NumPy 2
                       accuracy=sum(accuracies) / len(accuracies),
                       epsilon=max((r["epsilon"] for r in runs if r.get("epsilon") is not None),
                                   default=None),
                       accuracies=accuracies)


def _chosen_header(settings: TuneSettings, best: PointResult) -> str:
    sets = " ".join(f"--set {o}" for o in best.overrides) or "(no overrides: the config as given)"
    return (f"# Chosen by `dpgrpo tune` on the public proxy {settings.proxy!r} at the private "
            f"run's budget (point {best.name!r}: {sets}).\n# Privacy cost of the choice: zero "
            "(trained and scored on the proxy only; it shares no question with the private "
            "training set). The [protocol] and [study] tables of the "
            "original file are not repeated here.\n\n")


def _accuracy_cell(r: PointResult) -> str:
    """The mean proxy accuracy, and each run's when there are several."""
    mean = f"{100 * (r.accuracy or 0):.1f}"
    if len(r.accuracies) < 2:
        return mean
    return f"{mean} ({' / '.join(f'{100 * a:.1f}' for a in r.accuracies)})"


def grid_table(result: TuneResult) -> str:
    """Markdown: each point's size, noise-to-signal and proxy accuracy, the chosen one marked."""
    from dpgrpo.reports.tables import markdown_table

    rows = [[("**" + r.name + "**") if r.name == result.chosen else r.name,
             " ".join(r.overrides) or "(as configured)", f"{r.trainable_params:,}",
             f"{r.expected_batch:g}", f"{r.sigma:.4f}", f"{r.noise_to_signal:.2f}",
             f"{r.completions:,}", _accuracy_cell(r)] for r in result.points]
    header = ["point", "overrides", "trainable p", "m", "sigma", "sigma sqrt(p)/m",
              "completions", "proxy accuracy (%): mean (per run)"]
    return (markdown_table(header, rows)
            + f"\n\nProxy base accuracy {100 * result.base_accuracy:.1f}%.\n")


__all__ = ["DEFAULT_GRID", "FIXED_KEYS", "TUNABLE_PREFIXES", "GridPoint", "PointResult",
           "TuneResult", "TuneSettings",
           "check_proxy", "grid_table", "load_tune", "parse_grid", "private_slots", "proxy_config",
           "run_tune"]
