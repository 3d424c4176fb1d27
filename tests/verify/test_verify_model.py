"""`dpgrpo verify`'s model checks pass on the production gradient path, and fail when broken."""

from __future__ import annotations

from dpgrpo import verify


def test_model_checks_pass():
    results = {r.check: r for r in verify.run_checks(("model",))}
    assert {"fast_equals_reference", "chunk_identity", "cross_prompt_isolation",
            "nonprivate_equivalence", "constant_reward_groups_kept"} <= results.keys()
    assert all(r.passed for r in results.values()), [r for r in results.values() if not r.passed]
    assert results["cross_prompt_isolation"].measured == 0.0


def test_isolation_check_detects_a_batch_level_normalizer(monkeypatch):
    """Whitening advantages across the batch couples prompts: the check must fail."""
    import dpgrpo.verify.model as vm

    def batch_whitened(rewards, eps=1e-4):
        return (rewards - rewards.mean()) / (rewards.std() + eps)

    monkeypatch.setattr(vm, "group_advantages", batch_whitened)
    assert vm._isolation() > 0.0
