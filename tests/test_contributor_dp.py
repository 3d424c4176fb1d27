"""Contributor-level DP with a model: a contributor's gradient is built from its own prompts only
(bit-identical whatever the other contributors), and a training run whose record is the
contributor states it, samples contributor slots and picks k problems from hidden randomness."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.grads import per_prompt_grads
from dpgrpo.objectives.grpo import GRPOObjective, build_grpo_batch, group_advantages
from dpgrpo.objectives.grpo import reference_logprobs
from dpgrpo.privacy.contributors import Contributor, ProblemChooser, round_prompts
from dpgrpo.privacy.contributors import sum_within_records
from dpgrpo.verify.fixtures import build_tiny_tokenizer, random_specs, tiny_fp32_policy
from dpgrpo.verify.fixtures import rollouts_from_specs
from dpgrpo.trainer import train


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def policy32(tok):
    """fp32 tiny Llama with a nonzero adapter: floating point shows any coupling."""
    return tiny_fp32_policy(tok)


def _contributor_grads(model, tok, people, specs, rewards, method):
    """One round: each contributor's prompts (all of them: k large), per-prompt gradients,
    then one summed gradient per contributor."""
    plan = round_prompts(people, ProblemChooser(8))
    order = [p for _, p in plan.prompts]
    rollouts = rollouts_from_specs(tok, [specs[i] for i in order])
    r = torch.stack([rewards[i] for i in order])
    batch = build_grpo_batch(rollouts, r, group_advantages(r),
                             reference_logprobs(model, rollouts, batch_size=2))
    grads = per_prompt_grads(model, GRPOObjective(), batch, method=method, rows_per_pass=2)
    return sum_within_records(grads, plan)


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_a_contributors_gradient_ignores_other_contributors_bit_for_bit(policy32, tok, method):
    """Contributor A (prompts 0-2) alone, then beside B (a much longer prompt and another one)
    placed before and after it: A's summed gradient is the same to the last bit (fp32)."""
    specs = random_specs(tok, 0, 3) + random_specs(tok, 1, 1, long=True) + random_specs(tok, 2, 1)
    gen = torch.Generator().manual_seed(3)
    rewards = [torch.randint(0, 2, (3,), generator=gen).float() for _ in specs]
    a = Contributor("A", tuple(("t", i) for i in (0, 1, 2)))
    b = Contributor("B", (("t", 3), ("t", 4)))
    alone = _contributor_grads(policy32, tok, [a], specs, rewards, method)
    before = _contributor_grads(policy32, tok, [b, a], specs, rewards, method)
    after = _contributor_grads(policy32, tok, [a, b], specs, rewards, method)
    for name in alone:
        assert alone[name].shape[0] == 1 and before[name].shape[0] == 2
        assert torch.equal(alone[name][0], before[name][1]), name
        assert torch.equal(alone[name][0], after[name][0]), name
    assert float(sum(alone[n][0].abs().sum() for n in alone)) > 0
    assert any(not torch.equal(after[n][0], after[n][1]) for n in after)


def _mapping(tmp_path, people: int, per_person: int):
    from dpgrpo.tasks import load_problems

    problems = load_problems("arithmetic", "train")[:people * per_person]
    path = tmp_path / "contributors.csv"
    path.write_text("id,contributor\n" + "".join(f"{p.id},person-{i // per_person}\n"
                                                for i, p in enumerate(problems)))
    return path


def tiny_config(model_dir, mapping, *extra: str):
    base = [f"model.name={model_dir}", "model.device=cpu", "data.limit=24",
            "data.privacy_unit=contributor", f"data.contributors={mapping}",
            "data.per_contributor=2", "data.n_slots=8", "privacy.expected_batch=3",
            "privacy.noise_multiplier=1.0", "train.steps=2", "train.group_size=2",
            "train.max_new_tokens=4", "train.checkpoint_every=1"]
    return apply_overrides(embedded_default(), base + list(extra))


def test_a_contributor_level_run_states_its_unit_and_samples_contributors(tiny_model_dir,
                                                                         tmp_path):
    from dpgrpo import run_setup
    from dpgrpo.privacy.accounting import compute_epsilon

    mapping = _mapping(tmp_path, people=6, per_person=4)  # 24 problems, 6 contributors
    seen = {}
    original = run_setup.build_run

    def spy(config, run_dir, ctx=None):
        seen["run"] = original(config, run_dir, ctx)
        return seen["run"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dpgrpo.trainer.build_run", spy)
        result = train(tiny_config(tiny_model_dir, mapping), tmp_path / "run")
    run, cert = seen["run"], result.certificate
    assert cert["unit"] == "one contributor (up to 2 problems per round)"
    assert cert["n"] == run.n == 8 and cert["q"] == 3 / 8 and run.sampler.n == 8
    assert cert["epsilon"] == pytest.approx(compute_epsilon(8, 3, 2, 1.0, 1 / 80).epsilon)
    assert "summed" not in cert["unit"] and "clipped once" in cert["record_isolation"]["gradients"]
    assert [s.id for s in run.slots[:6]] == [f"person-{i}" for i in range(6)]
    assert all(len(s.problems) == 4 for s in run.slots[:6]) and run.slots[6:] == [None, None]
    assert run.chooser.k == 2 and run.chooser.releasable and run.chooser._entropy is os.urandom
    rows = [json.loads(x) for x in
            (tmp_path / "run" / "recovery" / "telemetry.jsonl").read_text().splitlines()]
    assert all(r["prompts"] == 2 * r["batch_size"] for r in rows)  # 4 problems each, k = 2


def test_a_seeded_contributor_run_resumes_with_the_same_choices(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    mapping = _mapping(tmp_path, people=6, per_person=4)
    cfg = tiny_config(tiny_model_dir, mapping, "privacy.seed=5", "train.steps=3",
                      "privacy.expected_batch=6")
    full = train(cfg, tmp_path / "full")
    train(cfg, tmp_path / "part", stop_after=1)
    resumed = train(None, tmp_path / "part", resume=True)
    assert resumed.certificate["rounds_charged"] == full.certificate["rounds_charged"] == 3
    state = torch.load(tmp_path / "full" / "recovery" / "step-000003" / "state.pt",
                       weights_only=False)
    assert state["generators"]["chooser"]["source"] == "seeded"
    a = load_file(str(tmp_path / "full" / "release" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "part" / "release" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
