"""The trainer hands every record randomness bound to (round, slot) (issue 32, defect 1).

End to end on the tiny model: each round reads a fresh 32-byte key from the OS, and the
rollout seeds, shuffle coins and dropout seeds the trainer passes are exactly the key's
streams for the sampled slots: nothing depends on the batch-mates or the order. Mutations
this catches (docs/privacy-tests.md, "Randomness"): a public constant as the secure round key
(no read), per-prompt seeds handed out in order, dropout left to the global generator.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpgrpo.config import apply_overrides, embedded_default
from dpgrpo.privacy import record_coins
from dpgrpo.privacy.record_coins import RecordRandomness, RoundKey
from dpgrpo.privacy.sampling import PoissonSampler
from dpgrpo.training import trainer as trainer_module
from dpgrpo.training.arms import Arm
from dpgrpo.training.trainer import train


def _config(model_dir, *extra: str):
    base = [f"model.name={model_dir}", "model.device=cpu", "data.limit=20",
            "privacy.expected_batch=6", "privacy.noise_multiplier=1.0", "train.rounds=3",
            "train.group_size=2", "train.max_new_tokens=4", "train.checkpoint_every=3",
            "model.lora_dropout=0.1"]
    return apply_overrides(embedded_default(), base + list(extra))


def _spy(monkeypatch):
    seen: dict[str, list] = {"keys": [], "sampled": [], "coins": [], "dropout": []}
    real_entropy, real_sample = record_coins.read_entropy, PoissonSampler.sample
    real_batch, real_grads = Arm.batch, trainer_module.per_prompt_grads

    def entropy(n):
        out = real_entropy(n)
        seen["keys"].append(out)
        return out

    def sample(self):
        out = real_sample(self)
        seen["sampled"].append([int(i) for i in out])
        return out

    def batch(self, records, generator=None, *, coins=None):
        seen["coins"].append(coins)
        return real_batch(self, records, generator, coins=coins)

    def grads(*args, dropout_seeds=None, **kw):
        seen["dropout"].append(dropout_seeds)
        return real_grads(*args, dropout_seeds=dropout_seeds, **kw)

    monkeypatch.setattr(record_coins, "read_entropy", entropy)
    monkeypatch.setattr(PoissonSampler, "sample", sample)
    monkeypatch.setattr(Arm, "batch", batch)
    monkeypatch.setattr(trainer_module, "per_prompt_grads", grads)
    return seen


def test_each_round_reads_a_fresh_key_and_binds_it_to_the_slots(tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    seen = _spy(monkeypatch)
    result = train(_config(tiny_model_dir), tmp_path / "run")
    assert result.certificate["releasable"] is True
    assert [len(k) for k in seen["keys"]] == [32, 32, 32]          # >= 128 bits per round
    assert len(set(seen["keys"])) == 3                              # fresh every round
    assert sum(len(s) for s in seen["sampled"]) > 0
    for key, sampled, coins, dropout in zip(seen["keys"], seen["sampled"], seen["coins"],
                                            seen["dropout"]):
        own = RoundKey(key)
        assert coins.key.key == key
        assert [s for s, _ in coins.owners] == sampled and all(j == 0 for _, j in coins.owners)
        assert coins.seeds("rollout") == [own.seed(s, 0, "rollout") for s in sampled]
        assert dropout == [own.seed(s, 0, "dropout") for s in sampled]
    assert "record_randomness" in result.certificate


def test_a_seeded_run_derives_its_keys_from_the_round_and_is_not_releasable(
        tiny_model_dir, tmp_path, monkeypatch):
    seen = _spy(monkeypatch)
    result = train(_config(tiny_model_dir, "privacy.seed=5"), tmp_path / "run")
    assert seen["keys"] == [] and result.certificate["releasable"] is False
    for t, coins in enumerate(seen["coins"]):
        assert coins.key.key == RecordRandomness(seed=5).round_key(t).key


def test_shuffled_arm_draws_each_prompts_shuffle_from_its_own_stream(tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    """The shuffled-reward control permutes each group by the prompt's own coins."""
    from dpgrpo.objectives import grpo

    used = []
    real = grpo.compute_advantages

    def spy(rewards, mode="group", *, coins=None, **kwargs):
        used.append(coins)
        return real(rewards, mode, coins=coins, **kwargs)

    seen = _spy(monkeypatch)
    monkeypatch.setattr("dpgrpo.training.arms.compute_advantages", spy)
    train(_config(tiny_model_dir, "train.arm=shuffled-reward"), tmp_path / "run")
    assert len(used) == 3
    for key, sampled, coins in zip(seen["keys"], seen["sampled"], used):
        if not sampled:
            continue
        expected = [RoundKey(key).uniforms(s, 0, "shuffle", 2) for s in sampled]
        assert np.array_equal(coins.numpy(), np.stack(expected).reshape(-1, 2))


@pytest.fixture(autouse=True)
def _quiet_torch():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
