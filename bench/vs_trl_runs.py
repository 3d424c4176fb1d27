"""``bench/vs_trl.py --runs K``: TRL and dpgrpo variants, K runs each, interleaved at one commit.

Learning claims are about runs: a 12-step GRPO run on this workload is bimodal (it learns the
short answer format in time, or not), so one run per library says little. This harness

* runs every chosen **variant** (:data:`VARIANTS`: TRL or dpgrpo, with the settings that make
  the two steps differ or agree) until each has K finished runs, **two runs at a time with one
  thread each** (both cores in use, every run under the same load), the next run always of the
  variant with the fewest runs so far, so the variants take turns and share the machine state.
  At most ``--trl-slots`` TRL runs at a time (default 1): one peaks at about 8.3 GB of RSS,
  so two fit in 24 GB only while little else runs;
* keeps **each finished run's record** (``WORK/runs/<variant>/<run>/record.json``: code version,
  settings, per-round reward and cap rate, seconds, peak RSS, the per-problem 0/1 of its greedy
  evaluation), so runs accumulate across sittings: a second call with the same ``--work`` only
  adds the runs still missing, and runs of other code are reported apart (:func:`commit`: the
  version is a hash of ``src/`` and these scripts, so a commit of docs or tests keeps it;
  ``--report`` pools only the records of one version unless ``--any-commit``);
* reports per variant (:func:`report`): accuracy after the last step, mean over runs with a
  bootstrap interval that resamples runs and then problems, the runs below 83%, per-round mean
  reward and cap rate, and against the variant's TRL counterpart Fisher's exact test on "below
  83%" and the Mann-Whitney test on the runs' accuracies.

The variants (``--variants a,b``) answer issue 55's questions: ``trl-nodrop`` against
``dpgrpo-nodrop-fixed`` is the decisive pair (both steps the same function: LoRA dropout 0 in
both, TRL's ``disable_dropout``, dpgrpo's non-private batch fixed at 8 prompts); the others add
back one difference at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import vs_trl

#: a run below this accuracy (after 12 steps) counts as failing (issue 55's cut)
FAIL_BELOW = 0.83


@dataclass(frozen=True)
class Variant:
    """One arm of the campaign: which library, and what differs from the workload's defaults."""

    library: str                                   # "trl" or "dpgrpo"
    help: str
    versus: str | None = None                      # the TRL variant it is tested against
    dropout: float | None = None                   # TRL: LoRA dropout (None: LORA's 0.05)
    disable_dropout: bool = False                  # TRL: GRPOConfig.disable_dropout
    sets: dict[str, object] = field(default_factory=dict)   # dpgrpo overrides


#: dpgrpo's step made TRL's (LoRA dropout 0.05 kept): D1, D2 and D3 all removed
_TRL_LIKE: dict[str, object] = {"train.batch_sampling": "fixed", "train.rollout_dropout": True,
                                "train.share_prompt_pass": False}

VARIANTS: dict[str, Variant] = {
    "trl": Variant("trl", "TRL GRPOTrainer as configured (LoRA dropout 0.05, in train mode)"),
    "trl-nodrop": Variant("trl", "TRL with LoRA dropout 0 and disable_dropout=True",
                          dropout=0.0, disable_dropout=True),
    "dpgrpo": Variant("dpgrpo", "dpgrpo non-private as from_trl_config maps TRL (Poisson "
                      "batch of 8 expected, LoRA dropout 0.05 bound to each prompt)",
                      versus="trl"),
    "dpgrpo-nodrop-fixed": Variant("dpgrpo", "dpgrpo non-private, LoRA dropout 0, exactly 8 "
                                   "prompts a round: the step is TRL-nodrop's function",
                                   versus="trl-nodrop",
                                   sets={"model.lora_dropout": 0.0,
                                         "train.batch_sampling": "fixed"}),
    "dpgrpo-fixed": Variant("dpgrpo", "dpgrpo non-private, exactly 8 prompts a round, dropout "
                            "0.05 (D1 and D2 back)", versus="trl",
                            sets={"train.batch_sampling": "fixed"}),
    "dpgrpo-nodrop": Variant("dpgrpo", "dpgrpo non-private, LoRA dropout 0, Poisson batch "
                             "(D3 back)", versus="trl-nodrop",
                             sets={"model.lora_dropout": 0.0}),
    "dpgrpo-trl-like": Variant("dpgrpo", "dpgrpo non-private, dropout 0.05, exactly 8 prompts, "
                               "rollouts sampled under dropout unmerged, one mask per row: the "
                               "step is TRL's own function", versus="trl", sets=_TRL_LIKE),
    "dpgrpo-d1": Variant("dpgrpo", "dpgrpo-trl-like with rollouts sampled merged, without "
                         "dropout (D1 back)", versus="trl",
                         sets={**_TRL_LIKE, "train.rollout_dropout": False}),
    "dpgrpo-d2": Variant("dpgrpo", "dpgrpo-trl-like with one dropout mask for a prompt's tokens, "
                         "shared by its rows (D2 back)", versus="trl",
                         sets={**_TRL_LIKE, "train.share_prompt_pass": True}),
}


def commit() -> str:
    """The code a run ran: the git tree of ``src/`` and the blobs of the two bench scripts at
    HEAD (12 hex digits of their hash), with ``+dirty`` when any of them differs from HEAD.
    A commit that changes only docs or tests keeps the version, so runs keep accumulating."""
    root = Path(__file__).resolve().parents[1]
    paths = ["src", "bench/vs_trl.py", "bench/vs_trl_runs.py"]
    try:
        ids = [subprocess.run(["git", "rev-parse", f"HEAD:{path}"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip() for path in paths]
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *paths],
                               cwd=root).returncode != 0
        untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "src"],
                                   cwd=root, text=True, capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    version = hashlib.sha256(" ".join(ids).encode()).hexdigest()[:12]
    return version + ("+dirty" if dirty or untracked else "")


# --- one run (a child process) -------------------------------------------------------------

def _count_dropout() -> tuple[dict[str, int], object]:
    """Count, process-wide, the calls of a dropout module that fires (train mode, p > 0):
    under no-grad (sampling; the reference pass runs with the adapter off) and with grad (the
    loss pass). Issue 55's D1 check that rollouts really sample under dropout. Returns the
    counts and the hook's handle."""
    import torch

    counts = {"no_grad": 0, "grad": 0}

    def hook(module: torch.nn.Module, _args: object, _out: object) -> None:
        if isinstance(module, torch.nn.Dropout) and module.training and module.p > 0:
            counts["grad" if torch.is_grad_enabled() else "no_grad"] += 1

    return counts, torch.nn.modules.module.register_module_forward_hook(hook)


def run_one(name: str, model_dir: Path, run_dir: Path, rounds: int, limit: int,
            sets: dict[str, object]) -> dict:
    """Train variant ``name`` once in this process and evaluate it: the run's record."""
    import resource

    import torch

    torch.set_num_threads(1)
    vs_trl.BATON[0] = False
    variant = VARIANTS[name]
    started = time.time()
    load = os.getloadavg()[0]
    fired, _ = _count_dropout()
    if variant.library == "trl":
        seed = secrets.randbelow(2**31)            # a fresh TRL seed per run, recorded
        out = vs_trl.run_trl(model_dir, run_dir, rounds, seed, dropout=variant.dropout,
                             disable_dropout=variant.disable_dropout)
        out["trl_seed"] = seed
    else:
        out = vs_trl.run_dpgrpo("non-private", model_dir, run_dir, rounds,
                                {**variant.sets, **sets})
    trained, fired = time.time(), dict(fired)     # training's dropout calls, not the eval's
    rows = vs_trl.scored(_evaluate(model_dir, Path(out["adapter"]), run_dir, limit))
    return {"variant": name, "library": variant.library, "commit": commit(),
            "settings": {"dropout": variant.dropout, "disable_dropout": variant.disable_dropout,
                         "sets": {**variant.sets, **sets}},
            "workload": {**vs_trl.TRL_OPTIONS, "lora": vs_trl.LORA, "rounds": rounds,
                         "eval_problems": limit},
            "trl_seed": out.get("trl_seed"), "threads": torch.get_num_threads(),
            "versions": library_versions(),
            "started": started, "train_seconds": trained - started,
            "eval_seconds": time.time() - trained, "loadavg_start": load,
            "loadavg_end": os.getloadavg()[0],
            "seconds_per_step": [r["seconds"] for r in out["rounds"]],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "telemetry": out.get("telemetry", []), "dropout_fired": fired,
            "ids": [i for i, _ in rows], "correct": [bool(c) for _, c in rows],
            "accuracy": sum(c for _, c in rows) / len(rows) if rows else 0.0}


def library_versions() -> dict[str, str | None]:
    """The versions a run ran with (the runs of 2026-12-03/05 kept none, and a later gap between
    them and the interleaved runs could not be told apart from a library change)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "trl", "accelerate", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _evaluate(model_dir: Path, adapter: Path, run_dir: Path, limit: int) -> Path:
    vs_trl.evaluate(model_dir, adapter, run_dir / "eval", limit)
    return run_dir / "eval" / "predictions.jsonl"


def write_record(run_dir: Path, record: dict) -> None:
    """``record.json``, written whole (a temporary file renamed over it)."""
    tmp = run_dir / "record.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(run_dir / "record.json")


# --- the campaign: runs two at a time, variants in turn ------------------------------------

def records(work: Path) -> list[dict]:
    """Every finished run's record under ``work/runs``."""
    out = []
    for path in sorted((work / "runs").glob("*/*/record.json")):
        record = json.loads(path.read_text())
        record["path"] = str(path.parent.relative_to(work))
        out.append(record)
    return out


def next_variant(wanted: Sequence[str], counts: dict[str, int], running: Sequence[str],
                 k: int, trl_slots: int = 1) -> str | None:
    """The variant to start next: of those with fewer than ``k`` runs finished or running,
    the one with the fewest (ties in ``wanted``'s order); a TRL variant only while fewer than
    ``trl_slots`` TRL runs are running (memory: one TRL run peaks at about 8.3 GB). None:
    nothing to start now."""
    trl_busy = sum(VARIANTS[v].library == "trl" for v in running) >= trl_slots
    best = None
    for name in wanted:
        have = counts.get(name, 0) + sum(v == name for v in running)
        if have >= k or (trl_busy and VARIANTS[name].library == "trl"):
            continue
        if best is None or have < best[1]:
            best = (name, have)
    return None if best is None else best[0]


def child_command(name: str, model_dir: Path, run_dir: Path, rounds: int, limit: int,
                  sets: Sequence[str]) -> list[str]:
    return [sys.executable, __file__, "--child", name, "--model-dir", str(model_dir),
            "--run-dir", str(run_dir), "--rounds", str(rounds), "--eval", str(limit),
            *(x for kv in sets for x in ("--set", kv))]


def campaign(work: Path, wanted: Sequence[str], k: int, model_dir: Path, *, rounds: int = 12,
             limit: int = 200, slots: int = 2, sets: Sequence[str] = (), trl_slots: int = 1,
             poll: float = 5.0, log=print) -> list[dict]:
    """Run the variants until each has ``k`` finished runs of this commit under ``work``,
    ``slots`` runs at a time, at most ``trl_slots`` of them TRL runs."""
    for name in wanted:
        if name not in VARIANTS:
            raise SystemExit(f"vs_trl --runs: unknown variant {name!r}; known: "
                             + ", ".join(VARIANTS))
    here = commit()
    counts: dict[str, int] = {}
    for record in records(work):
        if record["commit"] == here:
            counts[record["variant"]] = counts.get(record["variant"], 0) + 1
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    running: dict[str, tuple[subprocess.Popen, Path]] = {}     # run id -> process, folder
    while True:
        for run_id, (proc, folder) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[run_id]
            name = folder.parent.name
            if (folder / "record.json").exists():
                counts[name] = counts.get(name, 0) + 1
                acc = json.loads((folder / "record.json").read_text())["accuracy"]
                log(f"{time.strftime('%H:%M:%S')} {name} {folder.name}: {100 * acc:.1f}% "
                    f"({counts[name]}/{k})")
            else:
                log(f"{time.strftime('%H:%M:%S')} {name} {folder.name}: failed (exit "
                    f"{proc.returncode}; see {folder / 'log.txt'}); it will be run again")
        while len(running) < slots:
            name = next_variant(wanted, counts, [f.parent.name for _, f in running.values()], k,
                                trl_slots)
            if name is None:
                break
            run_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
            folder = work / "runs" / name / run_id
            folder.mkdir(parents=True)
            with open(folder / "log.txt", "w") as out:
                proc = subprocess.Popen(child_command(name, model_dir, folder, rounds, limit,
                                                      sets),
                                        stdout=out, stderr=subprocess.STDOUT, env=env)
            running[run_id] = (proc, folder)
            log(f"{time.strftime('%H:%M:%S')} started {name} {run_id}")
        if not running:
            return [r for r in records(work) if r["commit"] == here]
        time.sleep(poll)


# --- the report ----------------------------------------------------------------------------

def _curves(runs: Sequence[dict], key: str) -> list[float | None]:
    longest = max((len(r["telemetry"]) for r in runs), default=0)
    out: list[float | None] = []
    for i in range(longest):
        values = [float(r["telemetry"][i][key]) for r in runs
                  if len(r["telemetry"]) > i and r["telemetry"][i].get(key) is not None]
        out.append(sum(values) / len(values) if values else None)
    return out


def summarize(runs: Sequence[dict]) -> dict:
    """One variant's runs: accuracy per run, mean with the runs-then-problems interval, the
    failing runs, mean per-round curves, time and memory."""
    import statistics

    acc = [r["accuracy"] for r in runs]
    full = [r["correct"] for r in runs]
    out: dict[str, object] = {
        "runs": len(runs), "accuracy_per_run": acc, "accuracy_mean": statistics.fmean(acc),
        "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "below_83": sum(a < FAIL_BELOW for a in acc),
        "reward_per_round": _curves(runs, "reward_mean"),
        "cap_rate_per_round": _curves(runs, "cap_rate"),
        "seconds_per_step_median": statistics.median(
            s for r in runs for s in r["seconds_per_step"]),
        "peak_rss_gb_max": max(r["peak_rss_bytes"] for r in runs) / 1e9,
        "commits": sorted({r["commit"] for r in runs})}
    if full:
        out["accuracy"] = vs_trl.bootstrap_runs(full)
    return out


def compare(runs: Sequence[dict], reference: Sequence[dict]) -> dict:
    """A dpgrpo variant against its TRL counterpart: the difference in mean accuracy with the
    runs-then-problems interval, Fisher's exact test on the runs below 83% (two-sided), and
    the Mann-Whitney U test on the runs' accuracies (two-sided)."""
    from scipy import stats

    a = [r["accuracy"] for r in runs]
    b = [r["accuracy"] for r in reference]
    fa, fb = sum(x < FAIL_BELOW for x in a), sum(x < FAIL_BELOW for x in b)
    fisher = stats.fisher_exact([[fa, len(a) - fa], [fb, len(b) - fb]])
    mw = stats.mannwhitneyu(a, b, alternative="two-sided")
    full_a = [r["correct"] for r in runs]
    full_b = [r["correct"] for r in reference]
    out: dict[str, object] = {"versus": reference[0]["variant"],
                              "below_83": [fa, len(a), fb, len(b)],
                              "fisher_p": float(fisher.pvalue),
                              "mann_whitney_p": float(mw.pvalue)}
    if full_a and full_b:
        out["accuracy_minus_reference"] = vs_trl.bootstrap_runs(full_a, full_b)
    return out


def report(all_records: Sequence[dict], *, any_commit: bool = False) -> dict:
    """Every variant's summary, and each dpgrpo variant against its TRL counterpart, over the
    records of one commit (the newest one's, unless ``any_commit``)."""
    chosen = list(all_records)
    commit_used = "any"
    if not any_commit and chosen:
        newest = max(chosen, key=lambda r: r["started"])["commit"]
        chosen = [r for r in chosen if r["commit"] == newest]
        commit_used = newest
    by: dict[str, list[dict]] = {}
    for r in chosen:
        by.setdefault(r["variant"], []).append(r)
    out: dict[str, dict] = {}
    for name, runs in by.items():
        out[name] = summarize(runs)
        versus = VARIANTS[name].versus if name in VARIANTS else None
        if versus and by.get(versus):
            out[name]["against"] = compare(runs, by[versus])
    return {"commit": commit_used, "fail_below": FAIL_BELOW, "variants": out}


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="one run of a --runs campaign (a child)")
    parser.add_argument("--child", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--eval", type=int, default=200)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args(argv)
    record = run_one(args.child, args.model_dir, args.run_dir, args.rounds, args.eval,
                     vs_trl.parse_sets(args.sets))
    write_record(args.run_dir, record)


if __name__ == "__main__":
    main()
