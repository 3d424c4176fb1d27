"""Algorithm 1 end to end on the tiny random model: release/recovery split, resume, arms,
invariants (empty batches charged, non-finite updates skipped but charged), base weights fixed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.errors import ConfigError
from dpgrpo.privacy.accounting import PrivacyLedger, compute_epsilon
from dpgrpo.release.files import RELEASE_FILES
from dpgrpo.training.trainer import train


def tiny_config(model_dir, *extra: str):
    base = [f"model.name={model_dir}", "model.device=cpu", "data.limit=40",
            "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=4",
            "train.group_size=2", "train.max_new_tokens=6", "train.checkpoint_every=2"]
    return apply_overrides(embedded_default(), base + list(extra))


def _all_keys(obj) -> set:
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_all_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_all_keys(v) for v in obj)) if obj else set()
    return set()


def _adapter(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "release" / "adapter_model.safetensors"))


def test_release_and_recovery_split(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir)
    result = train(cfg, tmp_path / "run")
    release, recovery = tmp_path / "run" / "release", tmp_path / "run" / "recovery"
    assert {p.name for p in release.iterdir()} <= RELEASE_FILES
    assert {"adapter_model.safetensors", "adapter_config.json", "certificate.json",
            "dpgrpo_config.json", "README.md"} == {p.name for p in release.iterdir()}
    cert = result.certificate
    expected = compute_epsilon(40, 4, 4, 1.0, 1 / 400).epsilon
    assert cert["epsilon"] == pytest.approx(expected, rel=1e-12) and cert["delta"] == 1 / 400
    assert cert["q"] == 0.1 and cert["sigma"] == 1.0 and cert["clip_norm"] == 0.055
    assert cert["n"] == 40 and cert["rounds"] == 4 and cert["rounds_charged"] == 4
    adapter_cfg = json.loads((release / "adapter_config.json").read_text())
    # a local folder is named by its basename, never by this machine's path (issue 57)
    assert adapter_cfg["base_model_name_or_path"] == f"local model {tiny_model_dir.name}"
    assert cert["neighbouring_relation"] == "add-or-remove-one" and cert["releasable"] is True
    assert cert["arm"] == "dp-grpo" and "dp-accounting" in cert["accountant_version"]
    # Private training-time data and generator states live only in recovery/.
    keys = set()
    for name in ("certificate.json", "dpgrpo_config.json"):
        keys |= _all_keys(json.loads((release / name).read_text()))
    assert not keys & {"seed", "bit_generator", "state", "generators", "reward_mean", "rewards",
                       "length_mean", "telemetry", "optimizer"}
    assert (recovery / "telemetry.jsonl").exists() and (recovery / "journal.jsonl").exists()
    rows = [json.loads(x) for x in (recovery / "telemetry.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and "reward_mean" in rows[0]
    state = torch.load(recovery / (recovery / "latest").read_text().strip() / "state.pt",
                       weights_only=False)
    assert {"sampler", "noise", "rollout"} <= state["generators"].keys()
    # The adapter loads with PEFT and moved away from its zero-B initialization.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(release))
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)


def test_resume_gives_the_same_ledger(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, "privacy.seed=11")
    full = train(cfg, tmp_path / "full")
    part = train(cfg, tmp_path / "part", stop_after=2)  # interrupted right after checkpoint 2
    assert part.rounds_done == 2
    assert (tmp_path / "part" / "release" / "adapter_model.safetensors").read_bytes() != b""
    resumed = train(None, tmp_path / "part", resume=True)
    a = PrivacyLedger.from_dict(full.certificate["ledger"])
    b = PrivacyLedger.from_dict(resumed.certificate["ledger"])
    assert a.events == b.events and resumed.certificate["epsilon"] == full.certificate["epsilon"]
    # Seeded generators are restored, so the resumed trajectory equals the uninterrupted one.
    fa, fb = _adapter(tmp_path / "full"), _adapter(tmp_path / "part")
    assert all(torch.allclose(fa[k], fb[k], atol=1e-6) for k in fa)
    assert full.certificate["releasable"] is False and full.certificate["seeded"] is True
    released = json.loads((tmp_path / "full" / "release" / "dpgrpo_config.json").read_text())
    assert released["privacy"]["seeded"]


def test_replayed_rounds_are_charged(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir)
    train(cfg, tmp_path / "run", stop_after=3)  # round 3 ran after checkpoint 2, then "crashed"
    resumed = train(None, tmp_path / "run", resume=True)
    cert = resumed.certificate
    assert cert["rounds_retained"] == 4 and cert["rounds_charged"] == 5  # round 3 twice
    expected = compute_epsilon(40, 4, 5, 1.0, 1 / 400).epsilon
    assert cert["epsilon"] == pytest.approx(expected, rel=1e-12)


def test_existing_run_is_not_overwritten(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, "train.rounds=1", "train.checkpoint_every=1")
    train(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="--resume"):
        train(cfg, tmp_path / "run")


def test_base_weights_never_change(tiny_model_dir, tmp_path, monkeypatch):
    from dpgrpo.model import base_weights_fingerprint
    from dpgrpo.training import setup as run_setup

    seen = {}
    original = run_setup.build_run

    def spy(config, run_dir, ctx=None):
        run = original(config, run_dir, ctx)
        seen["run"], seen["before"] = run, base_weights_fingerprint(run.model)
        return run

    monkeypatch.setattr("dpgrpo.training.trainer.build_run", spy)
    train(tiny_config(tiny_model_dir, "train.rounds=2"), tmp_path / "run")
    assert base_weights_fingerprint(seen["run"].model) == seen["before"]


def test_empty_batches_take_a_noise_step_and_are_charged(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, "privacy.expected_batch=0.0001", "train.rounds=2",
                      "privacy.seed=3")
    result = train(cfg, tmp_path / "run")
    telemetry = tmp_path / "run" / "recovery" / "telemetry.jsonl"
    rows = [json.loads(x) for x in telemetry.read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [0, 0]
    assert result.certificate["rounds_charged"] == 2
    lora_b = [v for k, v in _adapter(tmp_path / "run").items() if "lora_B" in k]
    assert any(float(v.abs().sum()) > 0 for v in lora_b)  # noise-only steps moved B off zero


def test_nonfinite_update_skips_step_but_is_charged(tiny_model_dir, tmp_path, monkeypatch):
    import dpgrpo.training.trainer as trainer
    from dpgrpo.privacy.mechanism import PrivatizedUpdate

    def poisoned(grads, **kwargs):
        update = {k: torch.full(v.shape[1:], float("nan")) for k, v in grads.items()}
        return PrivatizedUpdate(update, 0, 0, 0)

    monkeypatch.setattr(trainer, "privatize", poisoned)
    result = train(tiny_config(tiny_model_dir, "train.rounds=2"), tmp_path / "run")
    assert result.steps_skipped == 2 and result.certificate["rounds_charged"] == 2
    lora_b = [v for k, v in _adapter(tmp_path / "run").items() if "lora_B" in k]
    assert all(float(v.abs().sum()) == 0 for v in lora_b)  # no step was taken


def test_an_update_the_mechanism_calls_non_finite_never_reaches_the_optimizer(
        tiny_model_dir, tmp_path, monkeypatch):
    """The loop's own rule (invariant 3): when ``update.finite`` is false, apply_update is not
    called at all. Round 1's update is NaN; round 2's is 0.01 everywhere but its clipped sum was
    non-finite (``sum_finite=False``). apply_update's norm check would catch round 1 but would
    step on round 2's finite values, so without the loop's check B moves off zero."""
    import dpgrpo.training.trainer as trainer
    from dpgrpo.privacy.mechanism import PrivatizedUpdate

    fills = iter([float("nan"), 0.01])

    def flagged(grads, **kwargs):
        fill = next(fills)
        update = {k: torch.full(v.shape[1:], fill, dtype=torch.float64) for k, v in grads.items()}
        return PrivatizedUpdate(update, 0, 0, 0, sum_finite=math.isnan(fill))  # round 2: False

    calls, original = [], trainer.apply_update

    def spy(model, optimizer, update, **kwargs):
        calls.append(float(next(iter(update.values())).flatten()[0]))
        return original(model, optimizer, update, **kwargs)

    monkeypatch.setattr(trainer, "privatize", flagged)
    monkeypatch.setattr(trainer, "apply_update", spy)
    result = train(tiny_config(tiny_model_dir, "train.rounds=2"), tmp_path / "run")
    assert calls == [] and result.steps_skipped == 2
    assert result.certificate["rounds_charged"] == 2
    lora_b = [v for k, v in _adapter(tmp_path / "run").items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().sum()) == 0 for v in lora_b)


@pytest.mark.parametrize("arm", ["zero-advantage", "shuffled-reward", "positive-only",
                                 "non-private", "filtered-sft", "gold-sft"])
def test_every_arm_trains(tiny_model_dir, tmp_path, arm):
    extra = ["privacy.noise_multiplier=none"] if arm == "non-private" else []
    cfg = tiny_config(tiny_model_dir, *extra, f"train.arm={arm}", "train.rounds=2")
    cert = train(cfg, tmp_path / "run").certificate
    assert cert["arm"] == arm
    if arm == "non-private":
        assert math.isinf(cert["epsilon"]) and cert["private"] is False and not cert["releasable"]
    else:
        assert cert["epsilon"] == pytest.approx(compute_epsilon(40, 4, 2, 1.0, 1 / 400).epsilon)
        assert "Corollary 2" in cert["shared_budget"] and "sigma = 1," in cert["shared_budget"]


def test_sigma_is_calibrated_from_epsilon(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, "privacy.noise_multiplier=none", "privacy.epsilon=4",
                      "train.rounds=1", "train.checkpoint_every=1")
    cert = train(cfg, tmp_path / "run").certificate
    assert cert["epsilon"] <= 4.0 and cert["target_epsilon"] == 4.0
    assert compute_epsilon(40, 4, 1, 0.999 * cert["sigma"], 1 / 400).epsilon > 4.0


def test_unreachable_epsilon_is_a_config_error(tiny_model_dir, tmp_path):
    # at the default delta 1/(10 n) a large sigma reaches epsilon ~0 (TV <= delta); 1e-10 not
    cfg = tiny_config(tiny_model_dir, "privacy.noise_multiplier=none", "privacy.epsilon=1e-9",
                      "privacy.delta=1e-10")
    with pytest.raises(ConfigError, match="unreachable"):
        train(cfg, tmp_path / "run")


def test_canary_slots_count_in_n_and_stay_secret(tiny_model_dir, tmp_path, monkeypatch):
    from dpgrpo.training.canaries import CanaryPlan

    bits = [False, True, False, False, True, False]  # fixed: 4 absent canaries, every time
    monkeypatch.setattr("dpgrpo.training.canaries.draw_inclusion", lambda k, generator=None: bits)
    cfg = tiny_config(tiny_model_dir, "audit.canaries=6", "train.rounds=2")
    cert = train(cfg, tmp_path / "run").certificate
    assert cert["n"] == 46 and cert["canary_slots"] == 6 and cert["delta_pld"] == 1 / 460
    assert cert["q"] == 4 / 46 and list(CanaryPlan.load(tmp_path / "run" / "recovery" /
                                                         "canaries.json").included) == bits
    plan = CanaryPlan.load(tmp_path / "run" / "recovery" / "canaries.json")
    assert len(plan.canaries) == 6 and plan.slots == tuple(range(40, 46))
    release = tmp_path / "run" / "release"
    assert not any("canar" in p.name for p in release.iterdir())
    assert "included" not in _all_keys(json.loads((release / "certificate.json").read_text()))


def test_train_cli_end_to_end_with_resume(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    args = ["train", "--set", f"model.name={tiny_model_dir}", "--set", "model.device=cpu",
            "--set", "data.limit=40", "--set", "privacy.expected_batch=4", "--set",
            "privacy.noise_multiplier=1.0", "--rounds", "2", "--set", "train.group_size=2",
            "--set", "train.max_new_tokens=5", "--set", "train.checkpoint_every=1",
            "-o", str(tmp_path / "run"), "--quiet"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "release:" in first.output and "releasable" in first.output
    again = CliRunner().invoke(app, ["train", "--resume", str(tmp_path / "run"), "--quiet"])
    assert again.exit_code == 0, again.output  # already complete: nothing replayed
    cert = json.loads((tmp_path / "run" / "release" / "certificate.json").read_text())
    assert cert["rounds_charged"] == 2
    bad = CliRunner().invoke(app, ["train", "--set", "train.stepz=2"])
    assert bad.exit_code != 0 and "train.stepz" in str(bad.exception)


def test_bfloat16_base_keeps_fp32_update_arithmetic(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, "model.dtype=bfloat16", "train.rounds=2")
    cert = train(cfg, tmp_path / "run").certificate
    lora = _adapter(tmp_path / "run")
    assert cert["rounds_charged"] == 2
    assert all(v.dtype == torch.float32 for v in lora.values())


def test_eval_a_trained_run_by_its_directory(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    train(tiny_config(tiny_model_dir, "train.rounds=1", "train.checkpoint_every=1"),
          tmp_path / "run")
    out = CliRunner().invoke(app, ["eval", "--run", str(tmp_path / "run"), "--limit", "3",
                                   "--max-new-tokens", "4", "--out", str(tmp_path / "eval")])
    assert out.exit_code == 0, out.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["arm"] == "dp-grpo" and summary["task"] == "arithmetic" and summary["n"] == 3
    assert summary["adapter"] and "release" in summary["adapter"]


def test_the_update_is_clipped_to_max_update_norm_before_the_adamw_step():
    from dpgrpo.training.trainer import apply_update

    def moved(max_norm):
        model = torch.nn.Linear(3, 2, bias=False)
        start = model.weight.detach().clone()
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)     # the step is the update itself
        norm = apply_update(model, sgd, {"weight": torch.full((2, 3), 2.0)}, max_norm=max_norm)
        assert model.weight.grad is None                      # zeroed for the next round
        return norm, float((start - model.weight.detach()).norm())

    assert moved(1.0) == pytest.approx((2 * math.sqrt(6), 1.0), rel=1e-5)  # clipped to 1
    assert moved(None) == pytest.approx((2 * math.sqrt(6), 2 * math.sqrt(6)), rel=1e-5)
    assert moved(100.0) == pytest.approx((2 * math.sqrt(6), 2 * math.sqrt(6)), rel=1e-5)


def test_max_update_norm_reaches_the_round_and_its_norm_the_private_telemetry(tiny_model_dir,
                                                                              tmp_path,
                                                                              monkeypatch):
    import dpgrpo.training.trainer as trainer_module

    seen, apply = [], trainer_module.apply_update

    def spy(*args, **kwargs):
        seen.append(kwargs.get("max_norm"))
        return apply(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "apply_update", spy)
    with pytest.raises(ConfigError, match=r"train.max_update_norm must be > 0"):
        tiny_config(tiny_model_dir, "train.max_update_norm=0").validate()
    cfg = tiny_config(tiny_model_dir, "train.max_update_norm=1e-3", "train.rounds=2",
                      "privacy.seed=5")
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in
            (tmp_path / "run" / "recovery" / "telemetry.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["update_norm"] > 1e-3 for r in rows)        # the noisy mean, before the clip
    assert seen == [1e-3, 1e-3]                               # each round's step clips at it
    public = (tmp_path / "run" / "metrics.jsonl")
    assert not public.exists() or "update_norm" not in public.read_text()
