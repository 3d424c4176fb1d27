"""The one table of arms: every arm validates, builds through make_arm and does what its row says
(objective, rollout source, advantage mode); the certificate's arm text comes from the table; an
unknown arm is a ConfigError naming train.arm."""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from dpgrpo.config import RunConfig, TrainConfig, apply_overrides, embedded_default
from dpgrpo.config.arms import ARMS, arm_spec, arms_with_role, private_twin
from dpgrpo.errors import ConfigError
from dpgrpo.experiments.protocol import LADDER_ARMS, NON_PRIVATE_ARM, PRIMARY_ARMS
from dpgrpo.objectives.grpo import ADVANTAGE_MODES, GRPOObjective, group_advantages
from dpgrpo.objectives.sft import SFTObjective
from dpgrpo.privacy.accounting import PrivacyLedger
from dpgrpo.training.arms import make_arm
from dpgrpo.verify.fixtures import build_tiny_tokenizer, synthetic_rollouts

REWARDS = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]  # prompt 0: one of three right; prompt 1: two


def _config(arm: str, *extra: str) -> RunConfig:
    private = [] if arm_spec(arm).private else ["privacy.noise_multiplier=none"]
    return apply_overrides(embedded_default(), [
        *private, f"train.arm={arm}", "train.group_size=3", "train.beta=0",
        "train.max_new_tokens=none", *extra])


class _Engine:
    """Records how it was asked to generate; returns fixed rollouts with texts naming the row."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, []

    def generate(self, messages, *, group_size, use_adapter, **_):
        self.calls.append(use_adapter)
        batch = synthetic_rollouts(self.tok, len(messages), group_size)
        batch.texts = [[f"{i} {r}" for r in range(group_size)] for i in range(len(messages))]
        return batch


class _Task:
    default_max_new_tokens = 7

    def prompt(self, problem):
        return f"question {problem}"

    def reward(self, text, problem):
        i, r = map(int, text.split())
        return REWARDS[i][r]

    def gold_target(self, problem):
        return f"answer {problem}"


def test_the_table_is_consistent_and_the_protocol_reads_its_roles():
    paper = {  # name: (objective, rollouts, advantage) -- Sections V, VII-C, IX
        "dp-grpo": ("grpo", "policy", "group"), "zero-advantage": ("grpo", "policy", "zero"),
        "shuffled-reward": ("grpo", "policy", "shuffled"),
        "positive-only": ("grpo", "policy", "positive"), "non-private": ("grpo", "policy", "group"),
        "filtered-sft": ("sft", "base", None), "gold-sft": ("sft", None, None),
        "non-private-gold-sft": ("sft", None, None)}  # the audit's positive control
    assert {a: (s.objective, s.rollouts, s.advantage) for a, s in ARMS.items()} == paper
    assert list(ARMS) == list(paper)
    for name, spec in ARMS.items():
        assert spec.name == name and spec.objective in ("grpo", "sft")
        assert (spec.advantage in ADVANTAGE_MODES) == (spec.objective == "grpo")
        assert spec.rollouts in ("policy", "base", None)
    assert [a for a in ARMS if not ARMS[a].private] == ["non-private", "non-private-gold-sft"]
    assert NON_PRIVATE_ARM == "non-private"      # the protocol's one sigma = 0 reference
    assert arms_with_role("audit") == ("non-private-gold-sft",)
    assert [private_twin(a) for a in ("non-private", "non-private-gold-sft")] == \
        ["dp-grpo", "gold-sft"]
    assert PRIMARY_ARMS == ("dp-grpo", "zero-advantage", "filtered-sft", "gold-sft")
    assert LADDER_ARMS == ("shuffled-reward", "positive-only")


@pytest.mark.parametrize("arm", list(ARMS))
def test_sigma_follows_the_table(arm):
    """A private arm refuses sigma = 0; a non-private one refuses any sigma it was given."""
    if arm_spec(arm).private:
        with pytest.raises(ConfigError, match=rf"arm '{arm}' is private"):
            _config(arm, "privacy.noise_multiplier=0")
        assert _config(arm, "privacy.noise_multiplier=0.5").privacy.noise_multiplier == 0.5
    else:
        with pytest.raises(ConfigError, match=rf"train.arm = '{arm}' uses sigma = 0"):
            _config(arm, "privacy.noise_multiplier=0.5")


def test_an_unknown_arm_is_a_config_error_naming_train_arm():
    for make in (lambda: TrainConfig(arm="dp-sgd"), lambda: arm_spec("dp-sgd"),
                 lambda: apply_overrides(RunConfig(), ["train.arm=dp-sgd"])):
        with pytest.raises(ConfigError, match=r"train\.arm must be one of dp-grpo, .*'dp-sgd'"):
            make()


@pytest.mark.parametrize("arm", list(ARMS))
def test_every_arm_validates_builds_and_batches_as_its_row_says(arm):
    spec, tok = ARMS[arm], build_tiny_tokenizer()
    cfg = _config(arm)
    assert cfg.private is spec.private
    with pytest.raises(ConfigError, match="group_size") if spec.normalizes_groups else \
            nullcontext():
        _config(arm, "train.group_size=1")
    policy = SimpleNamespace(model=object(), tokenizer=tok)
    built = make_arm(cfg, policy, _Task())
    assert built.spec is spec and built.cap == 7 and built.model is policy.model
    assert isinstance(built.objective, {"grpo": GRPOObjective, "sft": SFTObjective}[spec.objective])
    built._engine = engine = _Engine(tok)
    batch, _ = built.batch([(_Task(), 0), (_Task(), 1)], torch.Generator().manual_seed(0))
    if spec.rollouts is None:                                # gold SFT: no rollouts at all
        assert engine.calls == [] and batch.rows_per_prompt == 1
        return
    assert engine.calls == [not spec.base_rollouts]          # base rollouts: adapter off
    rewards = torch.tensor(REWARDS)
    if spec.objective == "sft":                              # 1/k on the k accepted rows
        assert batch.row_weights.tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
        return
    adv, eq2 = batch.advantages, group_advantages(rewards)
    if spec.advantage == "zero":
        assert adv.abs().sum() == 0
    elif spec.advantage == "positive":
        assert torch.equal(adv, rewards)
    elif spec.advantage == "group":
        assert torch.equal(adv, eq2) and (adv[:, 0] > 0).all()
    else:                                                    # Eq. (2) of permuted rewards
        assert spec.advantage == "shuffled"
        assert torch.equal(adv.sort(dim=1).values, eq2.sort(dim=1).values)


@pytest.mark.parametrize("arm", ["zero-advantage", "non-private", "non-private-gold-sft"])
def test_the_certificate_describes_the_arm_from_the_table(arm):
    from dpgrpo.release.certificate import certificate

    cfg = _config(arm, "privacy.group_sizes=", "privacy.noise_multiplier=" +
                  ("1.0" if arm_spec(arm).private else "none"))
    sigma = 1.0 if cfg.private else 0.0
    gen = SimpleNamespace(releasable=True, secure=True)
    run = SimpleNamespace(config=cfg, delta=1e-3, q=0.1, sigma=sigma, clip_norm=1.0, n=100,
                          n_source="data.n_slots", expected_batch=10.0, coordinates=10,
                          seeded=False, noise=gen, sampler=gen, coins=gen, num_canaries=0,
                          init_adapter_sha256=None)
    ledger = PrivacyLedger()
    ledger.record(0.1, sigma, 2)
    cert = certificate(run, ledger, 2)
    spec = ARMS[arm]
    assert cert["arm"] == arm and cert["private"] is spec.private
    assert f"{arm}: {spec.description}" in cert["shared_budget"]
    private = [a for a in ARMS if ARMS[a].private]
    assert f"every private arm ({', '.join(private)})" in cert["shared_budget"]
    if spec.private:
        assert math.isfinite(cert["epsilon"]) and "not_releasable_because" not in cert
    else:
        assert cert["not_releasable_because"] == f"{arm} arm: {spec.description}"
