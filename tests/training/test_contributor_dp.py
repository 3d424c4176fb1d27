"""Contributor-level DP with a model: a contributor's gradient is built from its own prompts only
(bit-identical whatever the other contributors), and a training run whose record is the
contributor states it, samples contributor slots and picks k problems from hidden randomness."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.objectives.grpo import (
    GRPOObjective,
    build_grpo_batch,
    group_advantages,
    reference_logprobs,
)
from dpgrpo.privacy.contributors import (
    Contributor,
    ProblemChooser,
    round_prompts,
    sum_within_records,
)
from dpgrpo.training.grads import per_prompt_grads
from dpgrpo.training.trainer import train
from dpgrpo.verify.fixtures import (
    build_tiny_tokenizer,
    random_specs,
    rollouts_from_specs,
    tiny_fp32_policy,
)


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
    """A gsm8k split of exactly people * per_person problems (contributor mode refuses
    data.limit) and the file mapping them to their contributors."""
    from dpgrpo.tasks import load_problems

    folder = tmp_path / "data" / "gsm8k"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(
        json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
        for i in range(people * per_person)))
    problems = load_problems("gsm8k", "train", tmp_path / "data")
    path = tmp_path / "contributors.csv"
    path.write_text("id,contributor\n" + "".join(f"{p.id},person-{i // per_person}\n"
                                                for i, p in enumerate(problems)))
    return path


def tiny_config(model_dir, mapping, *extra: str):
    base = [f"model.name={model_dir}", "model.device=cpu", "data.task=gsm8k",
            f"data.data_dir={mapping.parent / 'data'}",
            "data.privacy_unit=contributor", f"data.contributors={mapping}",
            "data.per_contributor=2", "data.n_slots=8", "privacy.expected_batch=3",
            "privacy.noise_multiplier=1.0", "train.rounds=2", "train.group_size=2",
            "train.max_new_tokens=4", "train.checkpoint_every=1"]
    return apply_overrides(embedded_default(), base + list(extra))


def test_a_contributor_level_run_states_its_unit_and_samples_contributors(tiny_model_dir,
                                                                         tmp_path):
    from dpgrpo.privacy.accounting import compute_epsilon
    from dpgrpo.training import setup as run_setup

    mapping = _mapping(tmp_path, people=6, per_person=4)  # 24 problems, 6 contributors
    seen = {}
    original = run_setup.build_run

    def spy(config, run_dir, ctx=None):
        seen["run"] = original(config, run_dir, ctx)
        return seen["run"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dpgrpo.training.trainer.build_run", spy)
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
    cfg = tiny_config(tiny_model_dir, mapping, "privacy.seed=5", "train.rounds=3",
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


def test_contributor_mode_refuses_problem_level_truncation():
    """Issue 32, defect 4: with data.limit, removing one contributor shifted the first `limit`
    problems and changed other contributors' records (3 records differed)."""
    from dpgrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.limit = 24 with data.privacy_unit = "
                                          r"'contributor'.*other contributors' records"):
        apply_overrides(embedded_default(), ["data.privacy_unit=contributor", "data.limit=24",
                                             "data.n_slots=8"])
    ok = apply_overrides(embedded_default(), ["data.privacy_unit=contributor", "data.n_slots=8"])
    assert ok.data.limit is None and ok.data.n_slots == 8


def test_contributor_mode_without_n_slots_is_refused_before_the_run(tmp_path):
    """Issue 32: n taken from the mapping file (the count of contributors in the private data)
    is data-dependent, so private. Contributor mode needs the public data.n_slots, refused at
    config time: from overrides, from a TOML file, and by `dpgrpo train` before a run
    directory (and so any ledger or charge) exists."""
    from typer.testing import CliRunner

    from dpgrpo.cli import app
    from dpgrpo.config import load_config
    from dpgrpo.errors import ConfigError

    message = r"data.privacy_unit = 'contributor' needs data.n_slots.*n must be public"
    with pytest.raises(ConfigError, match=message):
        apply_overrides(embedded_default(), ["data.privacy_unit=contributor",
                                             "data.contributors=map.csv"])
    toml = tmp_path / "people.toml"
    toml.write_text('[data]\nprivacy_unit = "contributor"\ncontributors = "map.csv"\n')
    with pytest.raises(ConfigError, match=message):
        load_config(toml)
    assert load_config(toml, ["data.n_slots=40"]).data.n_slots == 40
    run = tmp_path / "x" / "run"
    result = CliRunner().invoke(app, ["train", str(toml), "-o", str(run), "--quiet"])
    assert result.exit_code != 0 and "needs data.n_slots" in str(result.exception)
    assert not (tmp_path / "x").exists()


def test_a_contributor_record_is_clipped_at_c_in_the_trainer(tiny_model_dir, tmp_path,
                                                             monkeypatch):
    """Mutation guard: contributor records clipped at k*C with sigma divided by k keep the
    noise std at sigma*C while a record can move the sum by k*C. In the trainer, every record
    reaching the mechanism is at most C after clipping, and the noise std is sigma*C."""
    from dpgrpo.privacy import mechanism

    clip = 1e-8  # below these gradients' norms (the KL term's, ~1e-6, from round 2 on)
    clipped, raw, stds = [], [], []
    clip_per_record, noise_and_scale = mechanism.clip_per_record, mechanism.noise_and_scale

    def spy_clip(grads, clip_norm):
        out = clip_per_record(grads, clip_norm)
        clipped.extend(mechanism.per_record_norms(out).tolist())
        raw.extend(mechanism.per_record_norms(grads).tolist())
        return out

    def spy_noise(total, *, clip_norm, noise_multiplier, expected_batch, noise):
        stds.append((clip_norm, clip_norm * noise_multiplier))
        return noise_and_scale(total, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                               expected_batch=expected_batch, noise=noise)

    monkeypatch.setattr(mechanism, "clip_per_record", spy_clip)
    monkeypatch.setattr(mechanism, "noise_and_scale", spy_noise)
    mapping = _mapping(tmp_path, people=6, per_person=4)
    cfg = tiny_config(tiny_model_dir, mapping, f"privacy.clip_norm={clip}",
                      "privacy.expected_batch=6", "train.rounds=3")
    cert = train(cfg, tmp_path / "run").certificate
    assert cert["clip_norm"] == clip and cert["sigma"] == 1.0
    assert max(raw) > 4 * clip                   # records far above C reached the mechanism
    assert max(clipped) <= clip * (1 + 1e-6)     # yet each contributor (2 problems) moves <= C
    assert max(clipped) == pytest.approx(clip, rel=1e-6)
    assert stds == [(clip, pytest.approx(1.0 * clip, rel=1e-12))] * 3  # C and sigma * C
