"""Greedy evaluation (Sec. VII-D of the DP-GRPO paper): one completion per problem.

:func:`run_eval` generates greedily in batches for the base model or a released adapter,
scores each response with every scorer of the task, appends the predictions to
``predictions.jsonl`` after each batch and rewrites ``summary.json``. A rerun into the same
folder skips the problems already finished (resume).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import ConfigError
from dpgrpo.evaluation.predictions import (
    Prediction,
    append_predictions,
    read_predictions,
    read_summary,
    score_response,
    summarize,
    write_summary,
)
from dpgrpo.tasks import DEFAULT_CHECK_TIMEOUT_S, Problem, get_task, load_problems
from dpgrpo.tasks.base import completion_cap

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from dpgrpo.rollout.engine import RolloutEngine

log = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.jsonl"
SUMMARY_FILE = "summary.json"
#: Summary fields that must match for a rerun to resume into the same folder.
_RUN_IDENTITY = ("task", "model", "adapter", "max_new_tokens")

#: ``progress(done, total)`` after every batch (done counts resumed problems too).
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and where to write it."""

    task: str
    model: str
    out_dir: Path
    data_dir: Path | None = None
    split: str = "eval"
    adapter: Path | None = None
    limit: int | None = None
    batch_size: int = 8
    max_new_tokens: int | None = None  # default: the task's completion cap (Table I)
    dtype: str = "float32"
    device: str = "auto"  # a GPU when there is one (run_setup.resolve_device)
    arm: str | None = None
    seed: int | None = None
    skip_invalid: bool = False
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    source: str = "local"
    engine: str = "transformers"  # or "vllm" (CUDA; pip install 'dpgrpo[vllm]')

    def __post_init__(self) -> None:
        from dpgrpo.rollout.engine import ENGINES

        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def load_model(
    model: str, adapter: Path | None, *, dtype: str, device: str
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """``(model, tokenizer)``: the frozen base model, or base + a saved adapter; ``device``
    ``auto`` is a GPU when there is one."""
    from dpgrpo import model as models
    from dpgrpo.training.setup import resolve_device

    device = str(resolve_device(device))
    if adapter is not None:
        policy = models.load_adapter(model, adapter, dtype=dtype, device=device)
        return policy.model, policy.tokenizer
    return models.load_base_model(model, dtype, device), models.load_tokenizer(model)


def _check_same_run(out_dir: Path, identity: Mapping[str, object]) -> None:
    path = out_dir / SUMMARY_FILE
    if not path.exists():
        return
    saved = read_summary(path)
    differing = [k for k in _RUN_IDENTITY if saved.get(k) != identity[k]]
    if differing:
        raise ConfigError(
            f"{out_dir} holds predictions of another run (different {', '.join(differing)}); "
            "use a new --out folder")


def run_eval(settings: EvalSettings, *, progress: Progress | None = None,
             loaded: tuple[torch.nn.Module, PreTrainedTokenizerBase] | None = None,
             engine: RolloutEngine | None = None) -> JSON:
    """Evaluate and return the summary; resumes from an existing predictions file.

    ``loaded`` passes an already loaded ``(model, tokenizer)`` (tests, notebooks); ``engine``
    a ready :class:`~dpgrpo.rollout.RolloutEngine` (default: the transformers engine).
    """
    from dpgrpo.rollout import make_engine

    task = get_task(settings.task, check_timeout_s=settings.check_timeout_s)
    problems = load_problems(task, settings.split, settings.data_dir,  # logs what it skips
                             skip_invalid=settings.skip_invalid, source=settings.source)
    split_ids = {p.id: i for i, p in enumerate(problems)}  # id -> doc_id (split order)
    problems = problems[:settings.limit] if settings.limit else problems
    cap = completion_cap(task, settings.max_new_tokens)
    identity: JSON = {"task": task.name, "model": settings.model,
                                "adapter": str(settings.adapter) if settings.adapter else None,
                                "max_new_tokens": cap}
    out_dir = Path(settings.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_same_run(out_dir, identity)
    pred_path = out_dir / PREDICTIONS_FILE
    done = {p.id: p for p in read_predictions(pred_path, repair_tail=True)}
    unknown = set(done) - set(split_ids)
    if unknown:
        raise ConfigError(f"{pred_path} has ids outside the {task.name} {settings.split} split "
                          f"(e.g. {sorted(unknown)[0]!r}); use a new --out folder")
    todo = [p for p in problems if p.id not in done]

    def write_summary_now() -> JSON:
        finished = [done[p.id] for p in problems if p.id in done]
        summary = summarize(finished, task=task.name, model=settings.model,
                            adapter=identity["adapter"], arm=settings.arm, seed=settings.seed,
                            max_new_tokens=cap)
        write_summary(out_dir / SUMMARY_FILE, summary)
        return summary

    if progress:
        progress(len(problems) - len(todo), len(problems))
    if todo:
        if engine is None:
            model, tokenizer = loaded or load_model(settings.model, settings.adapter,
                                                    dtype=settings.dtype, device=settings.device)
            engine = make_engine(settings.engine, model, tokenizer, model_name=settings.model,
                                 dtype=settings.dtype)
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start:start + settings.batch_size]
            rollout = engine.generate([task.prompt(p) for p in batch], group_size=1,
                                      temperature=0.0, max_new_tokens=cap, seeds=[0] * len(batch))
            finished = [_prediction(task, problem, texts[0], int(n), bool(capped),
                                    doc_id=split_ids[problem.id])
                        for problem, texts, n, capped in zip(
                            batch, rollout.texts, rollout.completion_lengths.tolist(),
                            rollout.hit_cap.tolist())]
            append_predictions(pred_path, finished)
            done.update((p.id, p) for p in finished)
            write_summary_now()
            if progress:
                progress(len(problems) - len(todo) + start + len(batch), len(problems))
    return write_summary_now()


def _prediction(task: Any, problem: Problem, response: str, n_tokens: int,
                hit_cap: bool, doc_id: int | None = None) -> Prediction:
    """One row, with the public evaluation problem's prompt and gold answer (lm-eval's
    ``doc_id`` / ``arguments`` / ``target``)."""
    scores = score_response(task, problem, response, hit_cap=hit_cap)
    return Prediction(problem.id, response, n_tokens, hit_cap, scores, doc_id=doc_id,
                      prompt=task.prompt(problem), target=problem.answer)
