"""Every code block of README.md and docs/*.md is run, or checked as far as this machine allows.

* ``dpgrpo ...`` command lines run in a scratch checkout (``configs/`` copied, ``../shared/data``
  beside it) through the real CLI (typer's CliRunner, in-process), at toy sizes: the rewrites
  of :data:`REWRITES` turn the real model into the tiny random Llama, a run folder the reader
  made (``runs/x``, ``RUN``) into one trained here, and ``--limit 50`` into ``--limit 2``; a
  command that trains or tunes gets the toy overrides of :data:`TOY` through its own documented
  ``--set`` option. A line whose comment says ``(exit N)`` must exit N, every other line 0.
  Lines that need a GPU, the hub or a value the reader supplies are named in :data:`NOT_RUN`
  with the reason; tests/docs/test_docs_examples.py checks their command and options.
* ``python -c "..."`` lines run in that checkout; ``bash scripts/setup.sh`` lines are what
  ``.ci/run`` itself runs.
* ``python`` blocks run (README's example, both of coming-from-trl.md's, in one namespace per
  page) with the same rewrites; ``python`` blocks marked ``<!-- docs-test: signatures MODULE
  ... -->`` are API listings: each name they call must exist, with the keyword parameters shown.
* ``toml`` blocks load as a config; ``json`` blocks are read by the reader they document.
* ``text`` blocks are diagrams and listings, not code; an unlabelled fence is refused.

Slow lines (a whole protocol, a tuning grid, a budget report at the paper's sizes) are marked
``slow``: CI runs them, ``-m "not slow"`` skips them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```(\S*)\s*$")
SHELL = {"bash", "console", "sh", "shell"}
MARKER = re.compile(r"<!--\s*docs-test:\s*signatures\s+([\w. ]+?)\s*-->")
TINY = "TINY_MODEL"  # replaced by the tiny model's folder

#: Text rewrites applied to every command line and python block before it runs: (what the
#: docs say, what runs here). Each must still occur somewhere, so the table cannot go stale.
REWRITES = [
    ("smollm2-135m", TINY), ("HuggingFaceTB/SmolLM2-135M-Instruct", TINY),
    ("/path/to/Qwen2.5-1.5B-Instruct", TINY),
    ("runs/dp-grpo-20260101-120000", "runs/x"),
    ("--limit 50", "--limit 2"), ("[0:32]", "[0:8]"),
    ("--permutations 50", "--permutations 5"),  # each refits the classifier: 887 s for 50 here
    # README's Python example and coming-from-trl.md: fewer rounds and tokens on the tiny model
    ('"train.rounds": 4', '"train.rounds": 1'),
    ('"train.max_new_tokens": 32', '"train.max_new_tokens": 4, "model.device": "cpu"'),
    ("max_completion_length=48", "max_completion_length=4"),
    ("per_device_train_batch_size=48", "per_device_train_batch_size=6"),
    ("max_steps=12", "max_steps=1"),
]
#: Appended (through each command's own --set) to the commands that train: toy sizes.
TOY = ["--set", f"model.name={TINY}", "--set", "model.device=cpu", "--set", "model.dtype=float32",
       "--set", "data.limit=40", "--set", "privacy.expected_batch=4", "--set", "train.rounds=2",
       "--set", "train.group_size=2", "--set", "train.max_new_tokens=4"]
TOY_OPTIONS = {"protocol": ["--eval-limit", "2", "--draws", "100", "--sign-draws", "100",
                            "--no-figures"],
               }
#: Command lines not run here, by prefix: why.
NOT_RUN = {
    "dpgrpo eval --task gsm8k --source hub": "needs the Hugging Face hub",
    "dpgrpo push ": "uploads to the Hugging Face hub (tests/release/test_release.py mocks it)",
    "torchrun ": "needs several GPUs (tests/training/test_distributed.py runs two CPU ranks)",
    "dpgrpo train --show-private-telemetry ...": "a template: '...' is the reader's command",
    "dpgrpo train --arm zero-advantage ...": "a template: '...' is the reader's command",
    "dpgrpo train --set model.lora_train=B": "a template: '...' is the reader's command",
    "dpgrpo train --task mypackage.tasks:TASK": "a template: the reader's own package",
    "dpgrpo train --set data.task=code": "the code sandbox (bwrap or unshare): tests/tasks",
    "dpgrpo audit mechanism configs/cpu-study.toml --n 1000 --coordinates 19584":
        "minutes of simulation at d = 19584 (tests/audit/test_whitebox.py runs small ones)",
    "bash scripts/setup.sh": "what .ci/run runs on a fresh clone",
    "dpgrpo tune configs/cpu-study.toml": "its grid warm-starts from the study's warm start "
                                          "(dpgrpo study); tests/experiments/test_tune.py runs a "
                                          "toy grid",
}
#: Run, but marked slow (minutes on two cores).
SLOW = ("dpgrpo protocol ", "dpgrpo privacy report ", "dpgrpo audit mia --run runs/x --members "
        "m.jsonl --nonmembers nm.jsonl -o audit/ --permutations 50", "dpgrpo verify",
        "dpgrpo train configs/gsm8k.toml", "dpgrpo train --resume runs/gsm8k-dpgrpo")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    text: str
    marker: str | None  # the signatures marker's modules


def _blocks() -> list[Block]:
    """Every fenced block of the docs, and indented blocks as ``bash`` (the docs indent only
    command lines)."""
    out = []
    for path in DOCS:
        doc = path.relative_to(ROOT).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        i, marker = 0, None
        while i < len(lines):
            found = MARKER.search(lines[i])
            if found:
                marker = found.group(1)
            m = FENCE.match(lines[i])
            if m:
                start, body = i + 1, []
                i += 1
                while i < len(lines) and not FENCE.match(lines[i]):
                    body.append(lines[i])
                    i += 1
                out.append(Block(doc, start, m.group(1), "\n".join(body), marker))
                marker = None
            elif (lines[i].startswith("    ") and lines[i].strip()
                  and (i == 0 or not lines[i - 1].strip())):
                start, body = i + 1, []
                while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                    body.append(lines[i][4:])
                    i += 1
                out.append(Block(doc, start, "bash", "\n".join(body).strip("\n"), None))
                continue
            i += 1
    return out


BLOCKS = _blocks()


def _command_lines() -> list[tuple[str, int, str]]:
    """(doc, line, command) of each shell block's commands, ``\\`` continuations joined."""
    out = []
    for block in BLOCKS:
        if block.lang not in SHELL:
            continue
        lines = block.text.splitlines()
        i = 0
        while i < len(lines):
            text, number = lines[i].strip().removeprefix("$ "), block.line + i
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            if text and not text.startswith("#"):
                out.append((block.doc, number, text))
            i += 1
    return out


COMMANDS = _command_lines()


def _rewrite(text: str, tiny: Path) -> str:
    for old, new in REWRITES:
        text = text.replace(old, new)
    text = re.sub(r"\bRUN\b", "runs/x", text)  # docs/usage.md's placeholder for a run folder
    return text.replace(TINY, str(tiny))


def _split(command: str) -> tuple[list[str], int]:
    """The arguments (a trailing comment dropped) and the exit status the comment expects."""
    want = re.search(r"#.*\(exit (\d+)\)", command)
    tokens = shlex.split(command, comments=True)
    return tokens, int(want.group(1)) if want else 0


def _not_run(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


# --- the docs hold only blocks this file knows --------------------------------------------------

def test_every_block_is_of_a_known_kind():
    unknown = [f"{b.doc}:{b.line} ```{b.lang}" for b in BLOCKS
               if b.lang not in SHELL | {"python", "toml", "json", "text"}]
    assert not unknown, f"label these fences (text for a diagram or listing): {unknown}"
    assert any(b.doc == "README.md" and b.lang == "python" for b in BLOCKS)
    assert len(COMMANDS) > 40


def test_the_rewrites_and_exemptions_still_match_the_docs():
    everything = "\n".join(b.text for b in BLOCKS)
    stale = [old for old, _ in REWRITES if old not in everything]
    stale += [p for p in NOT_RUN if not any(c.startswith(p) for _, _, c in COMMANDS)]
    stale += [p for p in SLOW if not any(c.startswith(p) for _, _, c in COMMANDS)]
    assert not stale, f"no longer in the docs: {stale}"


# --- a scratch checkout with a trained run ------------------------------------------------------

@pytest.fixture(scope="module")
def checkout(tmp_path_factory, tiny_model_dir, shared_data_dir) -> Path:
    """``repo/`` (configs/ copied, runs/x trained: two tiny rounds with two canaries; eval
    folders for `compare`; members files in the documented format) beside ``shared/data``."""
    from dpgrpo.config import apply_overrides, embedded_default
    from dpgrpo.training.trainer import train

    top = tmp_path_factory.mktemp("docs")
    (top / "shared").mkdir()
    (top / "shared" / "data").symlink_to(shared_data_dir.resolve())
    repo = top / "repo"
    shutil.copytree(ROOT / "configs", repo / "configs")
    cfg = apply_overrides(embedded_default(), [
        f"model.name={tiny_model_dir}", "model.device=cpu", "data.limit=40",
        "privacy.expected_batch=4", "train.rounds=2", "train.group_size=2",
        "train.max_new_tokens=4", "audit.canaries=2"])
    train(cfg, repo / "runs" / "x")
    from dpgrpo.tasks import load_problems

    def rows(split: str) -> str:  # the members format of docs/auditing.md
        return "".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer})
                       + "\n" for p in load_problems("arithmetic", split)[:8])

    (repo / "m.jsonl").write_text(rows("train"))
    (repo / "nm.jsonl").write_text(rows("eval"))
    for args in (["eval", "--run", "runs/x", "--limit", "2", "-o", "eval/dpgrpo-1", "--arm",
                  "dp-grpo", "--seed", "1"],
                 ["eval", "--run", "runs/x", "--limit", "2", "-o", "eval/control-1", "--arm",
                  "zero-advantage", "--seed", "1"],
                 ["eval", "--task", "arithmetic", "--model", str(tiny_model_dir), "--limit", "2",
                  "--device", "cpu", "-o", "eval/base"]):
        code, output = _run(args, repo)
        assert code == 0, output
    return repo


def _run(args: list[str], cwd: Path) -> tuple[int, str]:
    """Exit status and output of ``dpgrpo ARGS`` in ``cwd``; a library error exits 2, as
    ``dpgrpo.cli.main`` makes it."""
    from dpgrpo.cli import app
    from dpgrpo.errors import DPGRPOError

    old = Path.cwd()
    os.chdir(cwd)
    try:
        out = CliRunner().invoke(app, args)
    finally:
        os.chdir(old)
    text = out.output + (f"\n{out.exception!r}" if out.exception and
                         not isinstance(out.exception, SystemExit) else "")
    return (2 if isinstance(out.exception, DPGRPOError) else out.exit_code), text


def _params(command: str) -> list:
    marks = [pytest.mark.slow] if command.startswith(SLOW) else []
    why = _not_run(command)
    if why:
        marks = [pytest.mark.skip(reason=f"not run here: {why} (options checked by "
                                         "tests/docs/test_docs_examples.py)")]
    return marks


@pytest.mark.parametrize(
    "doc,line,command",
    [pytest.param(d, n, c, marks=_params(c), id=f"{d}:{n}") for d, n, c in COMMANDS])
def test_each_command_line_runs(doc, line, command, checkout, tiny_model_dir):
    text = _rewrite(command, tiny_model_dir)
    tokens, want = _split(text)
    if tokens[0] == "python":
        out = subprocess.run([sys.executable, *tokens[1:]], cwd=checkout, capture_output=True,
                             text=True)
        assert out.returncode == want, f"{doc}:{line}: {command}\n{out.stdout}{out.stderr}"
        return
    assert tokens[0] == "dpgrpo", f"{doc}:{line}: no rule to run '{command}'"
    args = [a for t in tokens[1:] for a in (sorted(glob.glob(t, root_dir=checkout)) or [t])
            if t not in ("...",)] if any("*" in t for t in tokens) else tokens[1:]
    if args and args[0] in ("train", "protocol") and "--resume" not in args:
        args = [*args, *_rewrite(" ".join(shlex.quote(t) for t in TOY), tiny_model_dir).split(),
                *TOY_OPTIONS.get(args[0], [])]
    code, output = _run(args, checkout)
    assert code == want, f"{doc}:{line}: dpgrpo {' '.join(args)} exited {code}:\n{output[-3000:]}"


# --- python, toml and json blocks ---------------------------------------------------------------

PYTHON_PAGES = sorted({b.doc for b in BLOCKS if b.lang == "python" and b.marker is None})
SLOW_PAGES = {"docs/coming-from-trl.md"}  # TRL's trainer, then dpgrpo's: minutes on two cores


@pytest.mark.parametrize("doc", [pytest.param(d, marks=[pytest.mark.slow] if d in SLOW_PAGES
                                              else []) for d in PYTHON_PAGES])
def test_each_python_block_runs(doc, checkout, tiny_model_dir, monkeypatch):
    """One namespace per page, blocks in order (coming-from-trl.md's second uses the first's)."""
    if doc == "docs/coming-from-trl.md":   # its first block is TRL's own script
        pytest.importorskip("trl", reason="needs the [trl] extra (pip install -e '.[trl]')")
    monkeypatch.chdir(checkout)
    namespace: dict = {"__name__": "__docs__"}
    for block in (b for b in BLOCKS if b.doc == doc and b.lang == "python" and b.marker is None):
        code = compile(_rewrite(block.text, tiny_model_dir), f"{doc}:{block.line}", "exec")
        exec(code, namespace)  # the documentation's own example
    result = namespace.get("result")
    assert result is not None and Path(result.release_dir).is_dir()
    assert result.certificate["epsilon"] <= 8 + 1e-9


def _signature_blocks() -> list[Block]:
    return [b for b in BLOCKS if b.lang == "python" and b.marker is not None]


@pytest.mark.parametrize("block", _signature_blocks(), ids=lambda b: f"{b.doc}:{b.line}")
def test_each_signature_listing_names_what_exists(block):
    import importlib
    import inspect

    modules = [importlib.import_module(m) for m in block.marker.split()]
    checked = 0
    for text in block.text.splitlines():
        m = re.match(r"^\s*(?:def\s+|class\s+)?((?:dpgrpo\.)?[A-Za-z_][\w.]*)\s*\((.*)", text)
        if not m or m.group(1) in ("dataclass", "Protocol"):
            continue
        name, rest = m.group(1), m.group(2)
        obj = _resolve(name, modules)
        if (obj is None and name[0].isupper()) or text.lstrip().startswith(("def ", "class ")):
            continue  # a method of the class above, or a class's own line: its fields follow
        assert obj is not None, f"{block.doc}:{block.line}: {name} does not exist"
        keywords = re.findall(r"[(,*]\s*(\w+)\s*=", "(" + rest.split(")")[0])
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        missing = [k for k in keywords if k not in params]
        assert not missing, f"{block.doc}:{block.line}: {name} has no parameter {missing}"
        checked += 1
    assert checked, f"{block.doc}:{block.line}: nothing checked"


def _resolve(name: str, modules: list) -> object | None:
    import importlib

    if name.startswith("dpgrpo."):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            return obj
        return None
    head, *tail = name.split(".")
    for module in modules:
        obj = getattr(module, head, None)
        for attr in tail:
            obj = getattr(obj, attr, None)
        if obj is not None:
            return obj
    return None


def test_each_toml_block_loads_as_a_config(tmp_path):
    from dpgrpo.config import load_config

    blocks = [b for b in BLOCKS if b.lang == "toml"]
    assert blocks
    for block in blocks:
        (tmp_path / "contributors.csv").write_text("id,contributor\n")
        path = tmp_path / "block.toml"
        path.write_text(block.text + "\n")
        config = load_config(path)
        assert config.to_dict() != {}, f"{block.doc}:{block.line}"


def test_each_json_block_is_read_by_its_reader(tmp_path):
    from dpgrpo.audit.pipeline import read_candidates

    blocks = [b for b in BLOCKS if b.lang == "json"]
    assert blocks
    for block in blocks:
        path = tmp_path / "members.jsonl"
        path.write_text(block.text + "\n")
        found = read_candidates(path)
        rows = [json.loads(x) for x in block.text.splitlines()]
        assert [(p.id, p.question, p.answer, task) for p, task in found] == [
            (r["id"], r["question"], r["answer"], r.get("task")) for r in rows]
