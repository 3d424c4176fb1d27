"""The Python API: :func:`train` and :func:`evaluate` (``from dpgrpo import train``).

Train on your own problems with your own reward functions (``reward(completion, problem) ->
float``, or TRL's ``reward(prompts, completions, **columns) -> list[float]``, called per prompt;
several are summed)::

    import dpgrpo

    def exact(completion, problem):
        return float(problem["answer"] in completion)

    result = dpgrpo.train(
        problems=[{"question": "What is 2 + 3?", "answer": "5"}, ...],  # or a datasets.Dataset
        rewards=exact, n_slots=1000,           # public n: see below
        model="HuggingFaceTB/SmolLM2-135M-Instruct",  # or a transformers model / PeftModel
        overrides={"train.rounds": 50, "privacy.epsilon": 8}, out="runs/mine")
    print(result.release_dir, result.certificate["epsilon"])

The problems and rewards become one :class:`~dpgrpo.tasks.custom.RewardTask`, registered by
name, so the trainer runs the same single loop (Algorithm 1) as for the built-in benchmarks.

**Coming from TRL** (docs/coming-from-trl.md): a dataset with TRL's ``prompt`` column (text or
conversational) and TRL reward functions work as they are, and ``**dpgrpo.from_trl_config(
GRPOConfig(...))`` maps a TRL config's options (or refuses, with the reason, those that cannot
hold under prompt-level DP).

**Public n.** The number of public slots n enters q = m / n and epsilon; the length of a
private list is itself private. Pass ``n_slots``: ``len(problems)`` only if the list is public,
else a public upper bound (slots beyond the list are absent records). A run without
``n_slots`` (or ``data.limit``) is refused.

**Privacy of reward functions.** A reward function is public code and must depend only on its
own call's arguments (one completion and its problem; for a TRL function, one prompt's G
completions and columns); state shared between calls would carry one problem into another
prompt's gradient. A reward that is not a finite number counts as 0.0; one that raises ends the
run (a crash that can depend on the data: make rewards total).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dpgrpo.config import (
    RunConfig,
    apply_overrides,
    config_from_dict,
    embedded_default,
    load_config,
)
from dpgrpo.config.json_types import JSON
from dpgrpo.config.loading import override_strings
from dpgrpo.config.schema import Dtype
from dpgrpo.errors import ConfigError

if TYPE_CHECKING:
    from dpgrpo.release.files import EvalDefaults
    from dpgrpo.tasks import VerifiedTask

Overrides = Mapping[str, object] | Sequence[str] | None
RewardFn = Callable[..., Any]  # (completion, problem) -> float, or TRL's (dpgrpo.tasks.custom)


def _config(config: RunConfig | str | Path | Mapping[str, object] | None) -> RunConfig:
    if config is None:
        return embedded_default()
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, Mapping):
        return config_from_dict(dict(config), source="dict")
    return load_config(config)


def _model_name(model: Any, tokenizer: Any, name: str | None) -> tuple[str, Dtype, str]:
    """Register an in-memory model; return (public name, dtype, device)."""
    from dpgrpo.model import register_model

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    public = name or getattr(getattr(base, "config", None), "_name_or_path", "") or ""
    if not public:
        raise ConfigError("the model object has no name_or_path: pass model_name='hub/id'")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(public)
    register_model(public, model, tokenizer)
    param = next(base.parameters())
    dtype = str(param.dtype).removeprefix("torch.")   # ModelConfig refuses one outside Dtype
    return public, cast(Dtype, dtype), str(param.device)


def _register(task: VerifiedTask) -> str:
    from dpgrpo.tasks import register_task

    register_task(task, replace=True)
    return task.name


def prepare(config: RunConfig | str | Path | Mapping[str, object] | None = None, *,
            model: object = None, tokenizer: object = None, model_name: str | None = None,
            task: str | VerifiedTask | None = None, problems: Iterable[object] | None = None,
            rewards: RewardFn | Sequence[RewardFn] | None = None,
            eval_problems: Iterable[object] | None = None, n_slots: int | None = None,
            overrides: Overrides = None, **task_options: Any) -> RunConfig:
    """The :class:`RunConfig` :func:`train` runs, with the model and task registered.

    ``config``: a RunConfig, a TOML path, nested dicts, or None (the embedded CPU demo).
    ``task``: a task name or a :class:`~dpgrpo.tasks.VerifiedTask`; with ``problems`` and
    ``rewards`` a task is built (:func:`dpgrpo.make_task`, ``task_options`` such as ``name``,
    ``prompt``, ``reward_weights`` go there). ``overrides``: ``{"train.rounds": 4}`` or
    ``["train.rounds=4"]``, applied last.
    """
    from dpgrpo.tasks import VerifiedTask, make_task

    cfg = _config(config)
    if problems is not None or rewards is not None:
        if problems is None or rewards is None:
            raise ConfigError("give both problems and rewards (or a task)")
        if task is not None:
            raise ConfigError("give a task, or problems and rewards, not both")
        task = make_task(problems, rewards, eval_problems=eval_problems, **task_options)
    elif task_options or eval_problems is not None:
        raise ConfigError(f"{sorted(task_options) or ['eval_problems']} need problems and rewards")
    data = cfg.data
    if isinstance(task, VerifiedTask):
        data = replace(data, task=_register(task))
    elif task is not None:
        data = replace(data, task=str(task))
    if n_slots is not None:
        data = replace(data, n_slots=n_slots)
    m = cfg.model
    if isinstance(model, (str, Path)):
        m = replace(m, name=str(model))
    elif model is not None:
        name, dtype, device = _model_name(model, tokenizer, model_name)
        m = replace(m, name=name, dtype=dtype, device=device)
    cfg = apply_overrides(replace(cfg, model=m, data=data), override_strings(overrides))
    if isinstance(task, VerifiedTask):  # refuse a private list's length before any work
        from dpgrpo.tasks.custom import check_public_n

        check_public_n(task, cfg.data.n_slots, cfg.data.capacity)
    return cfg


def train(config: RunConfig | str | Path | Mapping[str, object] | None = None, *,
          out: str | Path | None = None, resume: bool = False,
          progress: Callable[[dict[str, Any]], None] | None = None,
          show_private: bool = False, **kwargs: Any):
    """Train a LoRA adapter with DP-GRPO and write ``out/release`` and ``out/recovery``.

    Takes :func:`prepare`'s arguments (``model``, ``problems``, ``rewards``, ``n_slots``,
    ``task``, ``overrides``, ...). ``out`` defaults to ``runs/<arm>-<time>``. ``resume=True``
    continues the run in ``out`` with its saved config (pass the same model object and
    problems again if the run used them). ``progress`` receives public values per round.
    Returns a :class:`~dpgrpo.training.trainer.TrainResult` (release dir, certificate, rounds).
    """
    from dpgrpo.training.trainer import train as run_training

    cfg = prepare(config, **kwargs)
    if out is None:
        if resume:
            raise ConfigError("resume=True needs out=RUN_DIR")
        out = Path("runs") / f"{cfg.train.arm}-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_training(None if resume else cfg, out, resume=resume, progress=progress,
                        show_private=show_private)


def evaluate(run: str | Path | None = None, *, out: str | Path, model: object = None,
             tokenizer: object = None, task: object = None, adapter: str | Path | None = None,
             split: str = "eval", limit: int | None = None, device: str | None = None,
             dtype: str | None = None, batch_size: int = 8, max_new_tokens: int | None = None,
             data_dir: str | Path | None = None, source: str | None = None,
             model_name: str | None = None) -> JSON:
    """Greedy evaluation (``dpgrpo eval``): of a training run's release (``run``), or of
    ``model`` (name or object) with an optional ``adapter``, on ``task`` (name or task object;
    a task from :func:`dpgrpo.make_task` evaluates on its ``eval_problems``). Writes
    ``out/predictions.jsonl`` and ``out/summary.json``; returns the summary."""
    from dpgrpo.evaluation.evaluate import EvalSettings, run_eval
    from dpgrpo.release.files import eval_defaults
    from dpgrpo.tasks import VerifiedTask

    found: EvalDefaults = eval_defaults(run) if run is not None else {}
    if isinstance(task, VerifiedTask):
        task = _register(task)
    if model is not None and not isinstance(model, (str, Path)):
        model, obj_dtype, obj_device = _model_name(model, tokenizer, model_name)
        dtype, device = dtype or obj_dtype, device or obj_device
    model, task = model or found.get("model"), task or found.get("task")
    if model is None or task is None:
        raise ConfigError("give run, or model and task")
    data = data_dir or found.get("data_dir")
    settings = EvalSettings(
        task=str(task), model=str(model), out_dir=Path(out),
        data_dir=Path(data) if data else None, split=split,
        adapter=Path(adapter) if adapter else found.get("adapter"), limit=limit,
        batch_size=batch_size, max_new_tokens=max_new_tokens,
        dtype=dtype or found.get("dtype", "float32"), device=device or found.get("device", "auto"),
        arm=found.get("arm"), source=source or found.get("source", "local"))
    return run_eval(settings)


__all__ = ["evaluate", "prepare", "train"]
