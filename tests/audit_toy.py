"""A fabricated run directory for audit tests and demos: tiny model, random LoRA release.

:func:`make_toy_run` writes ``release/`` (a PEFT adapter whose B matrices are random, so the
fine-tuned policy differs from the base; ``dpgrpo_config.json``; ``certificate.json``) and
``recovery/canaries.json`` the way the trainer will. :func:`register_toy_task` registers
``audit-toy``, a verifier-only task (the response is correct when it contains the answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dpgrpo.audit.canary import CanaryPlan
from dpgrpo.tasks import (
    SCORERS,
    Problem,
    Verdict,
    VerifiedTask,
    register_scorer,
    register_task,
    task_names,
)

TOY_TASK = "audit-toy"
_TOY_SCORER = "audit_toy_contains"


def _contains(response: str, problem: Problem, *, hit_cap: bool = False,
              timeout_s: float = 10.0) -> Verdict:
    ok = problem.answer in response
    return Verdict(correct=ok, extracted=problem.answer if ok else None)


def register_toy_task() -> str:
    """Register (once) the ``audit-toy`` task and return its name."""
    if _TOY_SCORER not in SCORERS:
        register_scorer(_TOY_SCORER)(_contains)
    if TOY_TASK not in task_names():
        register_task(VerifiedTask(
            name=TOY_TASK, default_max_new_tokens=8, render_prompt=lambda p: p.question,
            render_gold=lambda p: f"The answer is {p.answer}.",
            scorer_names={"strict": _TOY_SCORER}, splits={}, needs_data_dir=False,
            description="audit tests: correct when the response contains the answer"))
    return TOY_TASK


def toy_problems(prefix: str, n: int, *, start: int = 0) -> list[Problem]:
    """n small addition problems with ids ``{prefix}-{i}``."""
    return [Problem(id=f"{prefix}-{i}", question=f"What is {i} plus {i + 3}?",
                    answer=str(2 * i + 3)) for i in range(start, start + n)]


def write_jsonl(path: str | Path, problems: list[Problem], task: str | None = None) -> Path:
    """Problems as the JSONL candidates file of ``dpgrpo audit mia``."""
    path = Path(path)
    with path.open("w") as f:
        for p in problems:
            row = {"id": p.id, "question": p.question, "answer": p.answer}
            f.write(json.dumps(row | ({"task": task} if task else {})) + "\n")
    return path


def make_toy_run(run_dir: str | Path, model_dir: str | Path, *, n_canaries: int = 12,
                 epsilon: float = 8.0, delta: float = 1e-5, seed: int = 0,
                 adapter_scale: float = 0.5) -> Path:
    """Fabricate ``run_dir`` with a random-LoRA release of the tiny model and a canary plan."""
    from dpgrpo.model import LoraSettings, load_policy

    run_dir = Path(run_dir)
    release = run_dir / "release"
    policy = load_policy(str(model_dir), lora=LoraSettings(rank=4, alpha=8, dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(adapter_scale * torch.randn(param.shape, generator=gen))
    policy.model.save_pretrained(release)
    task = register_toy_task()
    (release / "dpgrpo_config.json").write_text(json.dumps(
        {"model": {"name": str(model_dir)}, "task": {"name": task}}, indent=1))
    (release / "certificate.json").write_text(json.dumps({"epsilon": epsilon, "delta": delta}))
    plan = CanaryPlan.create(n_canaries, seed=seed, generator=torch.Generator().manual_seed(seed))
    plan.save(run_dir / "recovery" / "canaries.json")
    return run_dir
