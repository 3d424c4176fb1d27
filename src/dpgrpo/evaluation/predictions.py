"""Predictions files and summaries (docs/architecture.md, "Predictions files").

``predictions.jsonl`` holds one JSON object per problem::

    {"id", "doc_id", "prompt", "target", "response", "n_tokens", "hit_cap",
     "scores": {"<scorer>": {"extracted", "correct", "timed_out"}}}

close to lm-eval's per-sample output: ``doc_id`` (position in the split), ``prompt`` (the user
message before the chat template; lm-eval's ``arguments``), ``target`` (the gold answer: the
evaluation sets are public), ``response`` (lm-eval's ``resps``), ``scores[scorer].extracted``
(``filtered_resps``). Files written before those fields existed still read (they are None).

``summary.json`` aggregates them (:func:`summarize`). Scoring reads only the saved response,
so any scorer can be re-run on saved predictions without generating (:func:`rescore`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DataError
from dpgrpo.rundir.atomic import atomic_write_text
from dpgrpo.tasks import Problem, Verdict, VerifiedTask

log = logging.getLogger(__name__)

SUMMARY_KEYS = ("task", "model", "adapter", "arm", "seed", "n", "accuracy", "correct",
                "mean_tokens", "cap_rate", "verifier_timeouts", "max_new_tokens")


@dataclass(frozen=True)
class Prediction:
    """One greedy completion and its verdict under each scorer (keyed by role)."""

    id: str
    response: str
    n_tokens: int
    hit_cap: bool
    scores: Mapping[str, Verdict]
    doc_id: int | None = None      # position in the split
    prompt: str | list[dict[str, str]] | None = None  # the user message or the conversation
    #                                (chat template applied at generation)
    target: str | None = None      # the gold answer

    def to_json(self) -> dict[str, object]:
        extra = {key: getattr(self, key) for key in ("doc_id", "prompt", "target")
                 if getattr(self, key) is not None}
        return {"id": self.id, **extra, "response": self.response, "n_tokens": self.n_tokens,
                "hit_cap": self.hit_cap,
                "scores": {name: {"extracted": v.extracted, "correct": v.correct,
                                  "timed_out": v.timed_out} for name, v in self.scores.items()}}

    @classmethod
    def from_json(cls, obj: object, path: str, line: int) -> Prediction:
        def bad(message: str, field: str | None = None) -> DataError:
            return DataError(message, path=path, line=line, field=field)

        if not isinstance(obj, dict):
            raise bad("expected a JSON object")
        for key, kind in (("id", str), ("response", str), ("n_tokens", int), ("hit_cap", bool),
                          ("scores", dict)):
            if key not in obj:
                raise bad("missing field", key)
            if not isinstance(obj[key], kind):
                raise bad(f"expected {kind.__name__}", key)
        scores = {}
        for name, score in obj["scores"].items():
            if not isinstance(score, dict) or not isinstance(score.get("correct"), bool):
                raise bad("expected {extracted, correct, timed_out}", f"scores.{name}")
            scores[name] = Verdict(score["correct"], score.get("extracted"),
                                   bool(score.get("timed_out", False)))
        optional: tuple[tuple[str, Any], ...] = (("doc_id", int), ("prompt", (str, list)),
                                                 ("target", str))
        for key, allowed in optional:
            if obj.get(key) is not None and not isinstance(obj[key], allowed):
                raise bad("expected " + ("a string or a conversation" if key == "prompt"
                                         else allowed.__name__), key)
        return cls(obj["id"], obj["response"], obj["n_tokens"], obj["hit_cap"], scores,
                   doc_id=obj.get("doc_id"), prompt=obj.get("prompt"), target=obj.get("target"))


def score_response(task: VerifiedTask, problem: Problem, response: str, *,
                   hit_cap: bool = False) -> dict[str, Verdict]:
    """The verdict of every scorer of ``task`` on one response, keyed by role."""
    return {role: scorer(response, problem, hit_cap=hit_cap)
            for role, scorer in task.scorers().items()}


def read_predictions(path: str | Path, *, repair_tail: bool = False) -> list[Prediction]:
    """Read a predictions file; bad lines and duplicate ids raise :class:`DataError`.

    With ``repair_tail`` an unterminated last line (a write cut by a crash) is removed from the
    file with a warning instead, so an interrupted evaluation can resume.
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    if repair_tail and raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        log.warning("%s: dropping an unfinished last line (%d bytes) before resuming",
                    path, len(raw) - keep)
        with path.open("r+b") as handle:
            handle.truncate(keep)
        raw = raw[:keep]
    predictions, seen = [], set()
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"not a JSON line ({err})", path=str(path), line=number) from None
        prediction = Prediction.from_json(obj, str(path), number)
        if prediction.id in seen:
            raise DataError(f"duplicate id {prediction.id!r}", path=str(path), line=number,
                            field="id")
        seen.add(prediction.id)
        predictions.append(prediction)
    return predictions


def append_predictions(path: str | Path, predictions: Iterable[Prediction]) -> None:
    """Append finished predictions durably (one line each, flushed and fsynced)."""
    lines = "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in predictions)
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write(lines)
        handle.flush()
        os.fsync(handle.fileno())


def write_predictions(path: str | Path, predictions: Iterable[Prediction]) -> None:
    """Write a whole predictions file atomically."""
    text = "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in predictions)
    atomic_write_text(path, text)


def summarize(predictions: Sequence[Prediction], *, task: str, model: str,
              adapter: str | None = None, arm: str | None = None, seed: int | None = None,
              max_new_tokens: int | None = None) -> JSON:
    """The summary of a predictions set: accuracy per scorer over all predictions (a response
    with no extraction counts as incorrect), mean tokens, cap rate, and the number of
    predictions with at least one verifier timeout (or guard trip)."""
    n = len(predictions)
    roles = sorted({role for p in predictions for role in p.scores})
    correct = {role: sum(p.scores[role].correct for p in predictions if role in p.scores)
               for role in roles}
    return {
        "task": task, "model": model, "adapter": adapter, "arm": arm, "seed": seed, "n": n,
        "accuracy": {role: correct[role] / n for role in roles} if n else {},
        "correct": correct,
        "mean_tokens": sum(p.n_tokens for p in predictions) / n if n else 0.0,
        "cap_rate": sum(p.hit_cap for p in predictions) / n if n else 0.0,
        "verifier_timeouts": sum(any(v.timed_out for v in p.scores.values())
                                 for p in predictions),
        "max_new_tokens": max_new_tokens,
    }


def write_summary(path: str | Path, summary: Mapping[str, object]) -> None:
    """Write ``summary.json`` atomically (keys in contract order)."""
    atomic_write_text(path, json.dumps(dict(summary), indent=2) + "\n")


def read_summary(path: str | Path) -> dict[str, object]:
    """Read a ``summary.json``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"not a readable summary ({err})", path=str(path)) from None
    if not isinstance(data, dict):
        raise DataError("expected a JSON object", path=str(path))
    return data


@dataclass(frozen=True)
class Rescored:
    """Saved predictions scored again by one scorer."""

    predictions: list[Prediction]  # with ``scores[role]`` replaced by the new verdict
    role: str
    n: int
    correct: int
    timeouts: int
    changed: int  # verdicts that differ from the saved ones (0 if none were saved)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0


def rescore(predictions: Sequence[Prediction], problems: Sequence[Problem],
            task: VerifiedTask, role: str) -> Rescored:
    """Score saved responses again with the scorer ``role`` of ``task`` (no generation)."""
    from dpgrpo.errors import ConfigError

    scorers = task.scorers()
    if role not in scorers:
        raise ConfigError(f"task {task.name!r} has no scorer {role!r}; "
                          f"known: {', '.join(scorers)}")
    by_id = {p.id: p for p in problems}
    out, correct, timeouts, changed = [], 0, 0, 0
    for prediction in predictions:
        if prediction.id not in by_id:
            raise DataError(f"problem {prediction.id!r} is not in the {task.name} split",
                            field="id")
        verdict = scorers[role](prediction.response, by_id[prediction.id],
                                hit_cap=prediction.hit_cap)
        old = prediction.scores.get(role)
        changed += old is not None and (old.correct, old.extracted) != (verdict.correct,
                                                                        verdict.extracted)
        correct += verdict.correct
        timeouts += verdict.timed_out
        out.append(replace(prediction, scores={**prediction.scores, role: verdict}))
    return Rescored(out, role, len(out), correct, timeouts, changed)
