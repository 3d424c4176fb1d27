"""The fixed protocol end to end on the tiny model: every arm and seed trained and evaluated the
same way, one shared budget, OS-entropy runs, a resumed interrupted run, skip on rerun, compare
report; and the protocol's settings, recipes and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgrpo.config import apply_overrides, embedded_default, load_protocol_config
from dpgrpo.errors import ConfigError, PrivacyError
from dpgrpo.experiments.protocol import (
    PRIMARY_ARMS,
    SFT_CLIP_NORM,
    arm_config,
    check_shared_budget,
    plan_protocol,
    protocol_settings,
    run_protocol,
)
from dpgrpo.privacy.accounting import compute_epsilon


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_protocol_end_to_end_two_seeds(tiny_protocol_toml, tmp_path):
    from dpgrpo.training.trainer import train

    cfg, table = load_protocol_config(tiny_protocol_toml)
    plan = plan_protocol(cfg, protocol_settings(table), tmp_path / "out")
    names = [f"{a}-seed{k}" for a in PRIMARY_ARMS for k in (1, 2)]
    assert [r.name for r in plan.runs] == names and plan.n_eval == 10
    # An interrupted run (one of two rounds, checkpointed) that the protocol must resume.
    interrupted = next(r for r in plan.runs if r.name == "dp-grpo-seed2")
    train(interrupted.config, interrupted.run_dir, stop_after=1)

    result = run_protocol(plan)
    out = tmp_path / "out"
    assert result.status["dp-grpo-seed2"] == "resumed"
    assert {result.status[n] for n in names if n != "dp-grpo-seed2"} == {"trained"}

    # One base evaluation, one per (arm, seed); identical eval settings everywhere.
    base = _json(out / "base" / "summary.json")
    assert (base["arm"], base["seed"], base["n"]) == ("base", None, 10)
    for spec in plan.runs:
        summary = _json(spec.run_dir / "eval" / "summary.json")
        assert (summary["arm"], summary["seed"], summary["n"]) == (spec.arm, spec.seed, 10)
        assert summary["max_new_tokens"] == base["max_new_tokens"] == 4
        assert summary["adapter"] == str(spec.run_dir / "release")

    # Every private arm: the same q, sigma, T and epsilon; OS entropy, releasable.
    expected = compute_epsilon(40, 4, 2, 1.0, 1 / 400).epsilon
    certs = {n: _json(out / "runs" / n / "release" / "certificate.json") for n in names}
    assert {(c["q"], c["sigma"], c["rounds"], c["rounds_charged"]) for c in certs.values()} == {
        (0.1, 1.0, 2, 2)}
    assert {c["epsilon"] for c in certs.values()} == {expected} == {result.epsilon}
    assert all(c["releasable"] and not c["seeded"] for c in certs.values())
    rounds = [json.loads(x)["round"] for x in
              (interrupted.run_dir / "recovery" / "telemetry.jsonl").read_text().splitlines()]
    assert rounds == [1, 2]
    # Seeds are distinct runs (fresh OS entropy), not copies.
    adapters = [(out / "runs" / f"dp-grpo-seed{k}" / "release" / "adapter_model.safetensors")
                .read_bytes() for k in (1, 2)]
    assert adapters[0] != adapters[1]
    # Per-arm recipes: the supervised arms' learning rates and clipping norm (Appendix C-B).
    for arm, lr in (("filtered-sft", 5e-6), ("gold-sft", 2e-5)):
        released = _json(out / "runs" / f"{arm}-seed1" / "release" / "dpgrpo_config.json")
        assert released["train"]["learning_rate"] == lr
        assert released["privacy"]["clip_norm"] == SFT_CLIP_NORM
        assert certs[f"{arm}-seed1"]["clip_norm"] == SFT_CLIP_NORM
    assert certs["dp-grpo-seed1"]["clip_norm"] == 0.055

    # The comparison report covers every arm with its seeds.
    report = _json(out / "compare" / "report.json")
    assert [(a["name"], a["seeds"]) for a in report["arms"]] == [
        ("base", [1]), *((a, [1, 2]) for a in PRIMARY_ARMS)]
    assert report["focal"] == "dp-grpo" and (out / "compare" / "report.md").is_file()
    assert _json(out / "protocol.json")["results"]["gold-sft-seed2"]["epsilon"] == expected

    # Rerun: everything complete, nothing retrained or re-evaluated.
    stamps = {n: (out / "runs" / n / "release" / "adapter_model.safetensors").stat().st_mtime_ns
              for n in names}
    again = run_protocol(plan)
    assert set(again.status.values()) == {"complete"}
    assert stamps == {n: (out / "runs" / n / "release" / "adapter_model.safetensors")
                      .stat().st_mtime_ns for n in names}
    # A different recipe into the same folder is refused before any work.
    other = plan_protocol(apply_overrides(cfg, ["train.learning_rate=1e-3"]),
                          protocol_settings(table), out)
    with pytest.raises(ConfigError, match=r"dp-grpo-seed1 was trained with another config "
                                          r"\(differs in train.learning_rate\)"):
        run_protocol(other)


def test_settings_tables_recipes_and_refusals(tmp_path):
    settings = protocol_settings({"recipes": {"gold-sft": {"train": {"learning_rate": 1e-5}}}},
                                 ladder=True, non_private=True, seeds=None)
    assert settings.seeds == 2
    assert settings.all_arms() == (*PRIMARY_ARMS, "shuffled-reward", "positive-only",
                                   "non-private")
    assert settings.recipe("gold-sft") == ["train.learning_rate=1e-05",
                                           f"privacy.clip_norm={SFT_CLIP_NORM}"]
    assert settings.recipe("dp-grpo") == []
    assert protocol_settings({}, arms="dp-grpo, gold-sft").arms == ("dp-grpo", "gold-sft")
    for table, message in (({"sedes": 2}, "unknown key 'protocol.sedes'"),
                           ({"arms": ["dp-grpo", "base"]}, "unknown protocol arm 'base'"),
                           ({"seeds": 0}, "seeds must be >= 1"),
                           ({"non_private_seeds": 0}, "non_private_seeds must be >= 1"),
                           ({"recipes": {"gold-sft": {"privacy": {"expected_batch": 8}}}},
                            "sets 'privacy.expected_batch'"),
                           ({"recipes": {"gold-sft": {"train": {"rounds": 8}}}}, "'train.rounds'")):
        with pytest.raises(ConfigError, match=message):
            protocol_settings(table)

    base = apply_overrides(embedded_default(), ["privacy.seed=5"])
    seeded = arm_config(base, "zero-advantage", 3, 0.7, ["train.learning_rate=1e-4"])
    assert (seeded.privacy.seed, seeded.privacy.noise_multiplier) == (5 + 32, 0.7)
    assert (seeded.train.arm, seeded.train.learning_rate) == ("zero-advantage", 1e-4)
    unseeded = arm_config(embedded_default(), "non-private", 1, 0.7)
    assert unseeded.privacy.seed is None and unseeded.privacy.noise_multiplier is None

    # the non-private arm runs non_private_seeds times (default once), the private arms seeds
    plain = embedded_default()
    runs = plan_protocol(plain, protocol_settings({"non_private": True, "seeds": 2,
                                                   "arms": ["dp-grpo"]}), tmp_path / "p").runs
    assert [r.name for r in runs] == ["dp-grpo-seed1", "dp-grpo-seed2", "non-private-seed1"]
    runs = plan_protocol(plain, protocol_settings({"non_private": True, "seeds": 1,
                                                   "arms": ["dp-grpo"]}, non_private_seeds=3),
                         tmp_path / "p").runs
    assert [r.name for r in runs] == ["dp-grpo-seed1", *(f"non-private-seed{k}" for k in (1, 2, 3))]
    assert all(r.config.privacy.noise_multiplier is None for r in runs[1:])

    bad = tmp_path / "bad.toml"
    bad.write_text("[protocol]\nseeds = 2\n[nonsense]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[nonsense\]"):
        load_protocol_config(bad)
    cfg, table = load_protocol_config(None, ["train.rounds=3"])
    assert table == {} and cfg.train.rounds == 3
    with pytest.raises(ConfigError, match="has no split 'dev'"):
        plan_protocol(cfg, protocol_settings({}, eval_split="dev"), tmp_path / "x")

    cert = {"private": True, "n": 40, "q": 0.1, "sigma": 1.0, "rounds": 2, "delta": 0.0025,
            "epsilon": 0.6}
    assert check_shared_budget({"a": cert, "b": {**cert, "epsilon": 0.7},
                                "np": {"private": False, "sigma": 0.0}}) == 0.7
    with pytest.raises(PrivacyError, match="b differs from a in sigma"):
        check_shared_budget({"a": cert, "b": {**cert, "sigma": 0.9}})
    # a certificate written by dpgrpo 0.2.0 names T "steps": the same T is the same budget
    old = {k: v for k, v in cert.items() if k != "rounds"} | {"steps": 2}
    assert check_shared_budget({"a": cert, "old": old}) == 0.6
    with pytest.raises(PrivacyError, match="old differs from a in rounds"):
        check_shared_budget({"a": cert, "old": old | {"steps": 3}})


def test_a_run_saved_before_a_key_existed_counts_it_as_its_default(tmp_path):
    """A config saved by an earlier dpgrpo lacks later keys: with the default value the run is
    the same run; with another value it is refused, naming the key."""
    from dpgrpo.config import RunConfig
    from dpgrpo.experiments.protocol import RunSpec, check_existing

    cfg = RunConfig()
    saved = json.loads(json.dumps(cfg.to_dict(public=False)))
    del saved["train"]["cuda_graphs"]
    (tmp_path / "recovery").mkdir()
    (tmp_path / "recovery" / "config.json").write_text(json.dumps(saved))
    spec = RunSpec(arm="dp-grpo", seed=1, config=cfg, run_dir=tmp_path)
    check_existing(spec)
    other = RunSpec(arm="dp-grpo", seed=1, run_dir=tmp_path,
                    config=apply_overrides(cfg, ["train.cuda_graphs=false"]))
    with pytest.raises(ConfigError, match=r"differs in train.cuda_graphs\)"):
        check_existing(other)
