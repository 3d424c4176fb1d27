"""Read evaluation outputs into arms for ``dpgrpo compare`` (docs/architecture.md formats).

An input is a ``predictions.jsonl`` file, an eval output directory holding one (with its
``summary.json``), or a training run directory holding ``eval/predictions.jsonl``. The arm name
and seed come from ``summary.json`` (``arm``, ``seed``) when present, else from a label
(``ARM`` or ``ARM:SEED``), else from the path (``<arm>-seed<k>`` folder names). Several inputs
of one arm are its seeds. Problems are matched by ``id`` against the base.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpgrpo.errors import ConfigError, DataError
from dpgrpo.tasks.records import read_jsonl

_SEED_IN_NAME = re.compile(r"^(?P<arm>.+?)[-_.]?seed[-_]?(?P<seed>\d+)$")


@dataclass(frozen=True)
class EvalFile:
    """One evaluation of one model: per-problem correctness under each scorer, lengths, caps."""

    path: Path                          # the predictions.jsonl file
    arm: str
    seed: int | str | None
    ids: tuple[str, ...]
    correct: dict[str, np.ndarray]      # scorer -> (n,) bool
    n_tokens: np.ndarray                # (n,) int
    hit_cap: np.ndarray                 # (n,) bool


@dataclass(frozen=True)
class ArmResults:
    """All seeds of one arm, columns aligned to the shared problem order."""

    name: str
    seeds: tuple[int | str, ...]
    paths: tuple[Path, ...]
    correct: dict[str, np.ndarray]      # scorer -> (k, n) bool; scorers every seed has
    n_tokens: np.ndarray                # (k, n)
    hit_cap: np.ndarray                 # (k, n) bool


def predictions_path(path: Path) -> Path:
    """Resolve an input to its predictions.jsonl (file, eval dir, or run dir with eval/)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "predictions.jsonl", path / "eval" / "predictions.jsonl"):
        if candidate.is_file():
            return candidate
    raise DataError("no predictions.jsonl here (nor in eval/)", path=str(path))


def _parse_line(obj: object, path: Path, line: int) -> tuple[str, dict[str, bool], int, bool]:
    def bad(msg: str, field: str) -> DataError:
        return DataError(msg, path=str(path), line=line, field=field)

    if not isinstance(obj, dict):
        raise bad("expected a JSON object", "id")
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        raise bad("missing or non-string problem id", "id")
    scores = obj.get("scores")
    if not isinstance(scores, dict) or "strict" not in scores:
        raise bad("expected an object with at least the 'strict' scorer", "scores")
    correct = {}
    for name, verdict in scores.items():
        value = verdict.get("correct") if isinstance(verdict, dict) else None
        if not isinstance(value, bool):
            raise bad("expected a boolean 'correct'", f"scores.{name}.correct")
        correct[name] = value
    n_tokens, hit_cap = obj.get("n_tokens"), obj.get("hit_cap")
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 0:
        raise bad("expected a non-negative integer", "n_tokens")
    if not isinstance(hit_cap, bool):
        raise bad("expected a boolean", "hit_cap")
    return str(pid), correct, n_tokens, hit_cap


def read_predictions(path: Path) -> tuple[tuple[str, ...], dict[str, np.ndarray], np.ndarray,
                                          np.ndarray]:
    """Parse predictions.jsonl: ids, scorer -> correctness, n_tokens, hit_cap (in file order)."""
    ids: list[str] = []
    rows: list[dict[str, bool]] = []
    tokens: list[int] = []
    caps: list[bool] = []
    seen: dict[str, int] = {}
    for line_no, obj in read_jsonl(Path(path)):
        if isinstance(obj, DataError):
            raise obj
        pid, correct, n_tok, cap = _parse_line(obj, path, line_no)
        if pid in seen:
            raise DataError(f"duplicate problem id {pid!r} (first on line {seen[pid]})",
                            path=str(path), line=line_no, field="id")
        if rows and set(correct) != set(rows[0]):
            raise DataError(f"scorers {sorted(correct)} differ from line 1's {sorted(rows[0])}",
                            path=str(path), line=line_no, field="scores")
        seen[pid] = line_no
        ids.append(pid)
        rows.append(correct)
        tokens.append(n_tok)
        caps.append(cap)
    if not ids:
        raise DataError("no predictions", path=str(path))
    correct_by = {s: np.array([r[s] for r in rows], dtype=bool) for s in rows[0]}
    return tuple(ids), correct_by, np.array(tokens, dtype=np.int64), np.array(caps, dtype=bool)


def _parse_label(label: str) -> tuple[str, str | None]:
    arm, sep, seed = label.partition(":")
    if not arm or (sep and not seed):
        raise ConfigError(f"label {label!r} must be ARM or ARM:SEED")
    return arm, (seed if sep else None)


def _as_seed(value: object) -> int | str | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else text


def _name_from_path(pred: Path) -> tuple[str, str | None]:
    folder = pred.parent
    if folder.name == "eval":
        folder = folder.parent
    name = folder.name if pred.name == "predictions.jsonl" else pred.stem
    match = _SEED_IN_NAME.match(name)
    return (match["arm"], match["seed"]) if match else (name, None)


def load_eval_file(path: Path, label: str | None = None) -> EvalFile:
    """Load one input; name it from summary.json, else ``label``, else the path."""
    pred = predictions_path(path)
    summary: dict = {}
    summary_path = pred.parent / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DataError(f"invalid JSON ({err.msg})", path=str(summary_path)) from err
        if not isinstance(summary, dict):
            raise DataError("expected a JSON object", path=str(summary_path))
    arm, seed = _parse_label(label) if label else _name_from_path(pred)
    arm = str(summary["arm"]) if summary.get("arm") else arm
    seed_value = _as_seed(summary.get("seed")) if summary.get("seed") is not None else seed
    ids, correct, n_tokens, hit_cap = read_predictions(pred)
    return EvalFile(pred, arm, _as_seed(seed_value), ids, correct, n_tokens, hit_cap)


def _check_ids(ref: EvalFile, other: EvalFile) -> np.ndarray:
    """Column order taking ``other`` onto ``ref``'s ids; DataError naming both on mismatch."""
    if other.ids == ref.ids:
        return np.arange(len(ref.ids))
    index = {pid: i for i, pid in enumerate(other.ids)}
    missing = [pid for pid in ref.ids if pid not in index]
    extra = sorted(set(other.ids) - set(ref.ids))
    if missing or extra:
        example = (missing or extra)[0]
        raise DataError(f"problem ids differ from {ref.path}: {len(missing)} missing, "
                        f"{len(extra)} extra (e.g. {example!r})", path=str(other.path))
    return np.array([index[pid] for pid in ref.ids])


def _seed_key(seed: int | str) -> tuple[int, int, str]:
    return (0, seed, "") if isinstance(seed, int) else (1, 0, str(seed))


def group_arms(files: Sequence[EvalFile], ref: EvalFile) -> list[ArmResults]:
    """Group files into arms (first-seen order), seeds sorted, columns in ``ref``'s id order."""
    by_arm: dict[str, list[EvalFile]] = {}
    for f in files:
        by_arm.setdefault(f.arm, []).append(f)
    arms = []
    for name, members in by_arm.items():
        seeds = [f.seed if f.seed is not None else i + 1 for i, f in enumerate(members)]
        order = sorted(range(len(members)), key=lambda i: _seed_key(seeds[i]))
        members, seeds = [members[i] for i in order], [seeds[i] for i in order]
        for i in range(1, len(seeds)):
            if seeds[i] == seeds[i - 1]:
                raise DataError(f"arm {name!r} seed {seeds[i]} also given by {members[i - 1].path}",
                                path=str(members[i].path), field="seed")
        cols = [_check_ids(ref, f) for f in members]
        scorers = [s for s in members[0].correct if all(s in f.correct for f in members)]
        arms.append(ArmResults(
            name=name, seeds=tuple(seeds), paths=tuple(f.path for f in members),
            correct={s: np.stack([f.correct[s][c] for f, c in zip(members, cols)])
                     for s in scorers},
            n_tokens=np.stack([f.n_tokens[c] for f, c in zip(members, cols)]),
            hit_cap=np.stack([f.hit_cap[c] for f, c in zip(members, cols)])))
    return arms


def load_arms(inputs: Sequence[Path], base: Path,
              labels: Sequence[str] | None = None) -> tuple[ArmResults, list[ArmResults]]:
    """Load the base and the compared inputs; returns (base arm, other arms) on shared ids."""
    if labels and len(labels) != len(inputs):
        raise ConfigError(f"--labels gave {len(labels)} labels for {len(inputs)} inputs")
    base_file = load_eval_file(base)
    if not _has_summary_arm(base_file.path):
        base_file = EvalFile(base_file.path, "base", base_file.seed, base_file.ids,
                             base_file.correct, base_file.n_tokens, base_file.hit_cap)
    files = []
    for i, path in enumerate(inputs):
        f = load_eval_file(path, labels[i] if labels else None)
        if f.path.resolve() == base_file.path.resolve():
            continue                                   # the base given twice
        if f.arm == base_file.arm:
            raise ConfigError(f"{f.path}: arm {f.arm!r} is the base arm's name; "
                              "pass the base only with --base")
        files.append(f)
    if not files:
        raise ConfigError("nothing to compare: give at least one input besides --base")
    (base_arm,) = group_arms([base_file], base_file)
    return base_arm, group_arms(files, base_file)


def _has_summary_arm(pred: Path) -> bool:
    summary_path = pred.parent / "summary.json"
    if not summary_path.is_file():
        return False
    data = json.loads(summary_path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and bool(data.get("arm"))


#: what :func:`write_archive` writes; :func:`read_archive` refuses other versions
ARCHIVE_VERSION = 1


def _bits(row: np.ndarray) -> str:
    return "".join("1" if x else "0" for x in row)


def _arm_record(arm: ArmResults) -> dict[str, object]:
    return {"name": arm.name, "seeds": list(arm.seeds),
            "correct": {s: [_bits(r) for r in m] for s, m in arm.correct.items()},
            "n_tokens": arm.n_tokens.astype(int).tolist(),
            "hit_cap": [_bits(r) for r in arm.hit_cap]}


def write_archive(path: Path, ids: Sequence[str], base: ArmResults,
                  arms: Sequence[ArmResults], fixed: Sequence[str] = ()) -> Path:
    """Every arm's per-problem results (each seed's 0/1 per scorer, tokens, caps) in one small
    gzip'd JSON, so every interval of a comparison can be recomputed from it alone
    (:func:`read_archive`, then ``compare_arms``): the CPU study commits it beside its page.
    No response text and no path is kept. Written byte for byte the same for the same data."""
    import gzip

    data = {"version": ARCHIVE_VERSION, "ids": [str(i) for i in ids],
            "base": _arm_record(base), "arms": [_arm_record(a) for a in arms],
            "fixed": list(fixed)}
    payload = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                               filename="") as out:
        out.write(payload)
    return Path(path)


def read_archive(path: Path) -> tuple[ArmResults, list[ArmResults], list[str]]:
    """(base, arms, names of the fixed arms) of a :func:`write_archive` file."""
    import gzip

    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, ValueError) as err:
        raise DataError(f"not a predictions archive ({err})", path=str(path)) from None
    if not isinstance(data, dict) or data.get("version") != ARCHIVE_VERSION:
        raise DataError(f"expected a predictions archive of version {ARCHIVE_VERSION}",
                        path=str(path), field="version")
    n = len(data["ids"])

    def arm(obj: dict) -> ArmResults:
        def bits(rows: list[str], field: str) -> np.ndarray:
            if any(len(r) != n for r in rows):
                raise DataError(f"arm {obj['name']!r}: a row does not cover the {n} problems",
                                path=str(path), field=field)
            return np.array([[c == "1" for c in r] for r in rows], dtype=bool)

        return ArmResults(name=obj["name"], seeds=tuple(obj["seeds"]),
                          paths=tuple(Path(f"{path}#{obj['name']}") for _ in obj["seeds"]),
                          correct={s: bits(rows, f"correct.{s}")
                                   for s, rows in obj["correct"].items()},
                          n_tokens=np.asarray(obj["n_tokens"], dtype=int),
                          hit_cap=bits(obj["hit_cap"], "hit_cap"))

    return arm(data["base"]), [arm(a) for a in data["arms"]], list(data["fixed"])
