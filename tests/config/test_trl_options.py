"""from_trl_config: TRL's GRPOConfig options mapped onto dpgrpo's config, inert ones noted,
and the ones that cannot hold under prompt-level DP refused with the reason (trl not needed:
any object with the attributes, or a dict)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import dpgrpo
from dpgrpo.config.trl import OPTIONS, TRLSettings, from_trl_config
from dpgrpo.errors import ConfigError

#: TRL's GRPOConfig defaults for the options dpgrpo reads (TRL 0.2x/1.x, after __post_init__)
TRL_DEFAULTS = dict(
    num_generations=8, max_completion_length=256, beta=0.0, temperature=1.0, top_p=1.0,
    repetition_penalty=1.0, top_k=0, min_p=None, learning_rate=1e-6, reward_weights=None,
    scale_rewards="group", loss_type="dapo", epsilon=0.2, epsilon_high=None, delta=None,
    num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1,
    mask_truncated_completions=False, log_completions=False, max_steps=-1,
    per_device_train_batch_size=8, use_vllm=False, seed=42, max_grad_norm=1.0,
    use_bias_correction_kl=True, output_dir="trainer_output")


def grpo_config(**changes):
    """A stand-in GRPOConfig: an object with TRL's attributes (and others dpgrpo ignores)."""
    return SimpleNamespace(**{**TRL_DEFAULTS, **changes})


def test_a_grpo_config_object_maps_onto_the_run_config():
    args = grpo_config(loss_type="dr_grpo", scale_rewards=False, num_generations=6,
                       max_completion_length=48, beta=0.04, temperature=0.7, top_p=0.95,
                       repetition_penalty=1.05, learning_rate=1e-2, max_steps=12,
                       per_device_train_batch_size=48, mask_truncated_completions=True,
                       reward_weights=[1.0, 0.5], epsilon_high=0.28)
    settings = from_trl_config(args, overrides={"train.checkpoint_every": 6})
    assert isinstance(settings, TRLSettings) and settings.reward_weights == (1.0, 0.5)
    assert dict(settings) == {"overrides": settings.overrides, "reward_weights": [1.0, 0.5]}
    t, p = settings.config().train, settings.config().privacy
    assert (t.loss_type, t.scale_rewards, t.group_size, t.max_new_tokens, t.beta) == \
        ("dr_grpo", "none", 6, 48, 0.04)
    assert (t.temperature, t.top_p, t.repetition_penalty, t.learning_rate, t.rounds) == \
        (0.7, 0.95, 1.05, 1e-2, 12)
    assert t.mask_truncated_completions and t.checkpoint_every == 6
    assert t.tempered_logprobs and t.logprob_temperature == 0.7   # TRL's loss divides by T
    assert t.kl_bias_correction                   # TRL 1.16's use_bias_correction_kl default
    off = from_trl_config(args, use_bias_correction_kl=False).config().train
    assert not off.kl_bias_correction and not dpgrpo.config.TrainConfig().kl_bias_correction
    assert not t.clip_nonprivate                  # TRL clips no prompt, only the batch's mean
    assert t.max_update_norm == 1.0               # ... and the mean: every arm clips its update
    assert from_trl_config(args, max_grad_norm=0).config().train.max_update_norm is None
    assert "max_grad_norm=1.0: TRL clips the norm of the batch's mean gradient" in \
        " | ".join(settings.notes)
    assert p.expected_batch == 8.0                                      # 48 completions / G 6
    notes = " | ".join(settings.notes)
    assert "epsilon=0.2 accepted, without effect" in notes and "epsilon_high=0.28" in notes
    assert "importance ratio is exactly 1" in notes and "seed=42 not used" in notes


def test_a_dict_maps_only_its_keys_and_rejects_unknown_ones():
    settings = from_trl_config({"num_generations": 4, "loss_type": "grpo"})
    assert settings.overrides == {"train.group_size": 4, "train.loss_type": "grpo"}
    assert "reward_weights" not in settings and settings.notes == ()
    with pytest.raises(ConfigError, match=r"\['max_prompt_length'\] are not mapped"):
        from_trl_config({"max_prompt_length": 512})
    with pytest.raises(ConfigError, match="unknown TRL options"):
        from_trl_config({}, not_an_option=1)
    assert dpgrpo.from_trl_config is from_trl_config and dpgrpo.trl_reward
    assert set(OPTIONS) >= {"num_generations", "max_completion_length", "beta", "temperature",
                            "top_p", "top_k", "min_p", "repetition_penalty", "learning_rate",
                            "reward_weights", "scale_rewards", "loss_type", "epsilon",
                            "epsilon_high", "num_iterations", "mask_truncated_completions",
                            "log_completions"}


@pytest.mark.parametrize("change,needle", [
    ({"loss_type": "dapo"}, r"loss_type='dapo' is refused: it cannot hold under prompt-level DP"
                            r".*whole \(global\) batch.*prompt_token_mean"),
    ({"loss_type": "bnpo"}, r"cannot hold under prompt-level DP.*local batch.*prompt_token_mean"),
    ({"loss_type": "cispo"}, r"not implemented; dpgrpo offers grpo, dr_grpo, prompt_token_mean"),
    ({"scale_rewards": "batch"}, r"cannot hold under prompt-level DP.*batch-level standard"),
    ({"scale_rewards": "mean"}, r"not implemented"),
    ({"log_completions": True}, r"private prompts.*no opt-in"),
    ({"num_iterations": 2}, r"num_iterations=2 is refused: several optimizer steps on one "
                            r"sampled batch.*one subsampled-Gaussian event per round"),
    ({"steps_per_generation": 4}, r"steps_per_generation=4 is refused"),
    ({"top_k": 50}, r"top_k=50 is refused: .*temperature, top_p and repetition_penalty only"),
    ({"min_p": 0.1}, r"min_p=0.1 is refused"),
])
def test_options_that_cannot_hold_are_refused_with_the_reason(change, needle):
    with pytest.raises(ConfigError, match=needle):
        from_trl_config(grpo_config(**{"loss_type": "grpo", **change}))


def test_trl_defaults_are_refused_for_dapo_and_a_change_fixes_it():
    with pytest.raises(ConfigError, match="loss_type='dapo'"):         # TRL's default loss
        from_trl_config(grpo_config())
    settings = from_trl_config(grpo_config(), loss_type="prompt_token_mean")
    cfg = settings.config()
    assert cfg.train.loss_type == "prompt_token_mean" and cfg.train.temperature == 1.0
    assert cfg.train.beta == 0.0 and cfg.train.max_new_tokens == 256
    assert cfg.privacy.expected_batch == 1.0                            # 8 completions / G 8
    assert any("max_steps=-1" in n for n in settings.notes)
    with pytest.raises(ConfigError, match="give num_generations too"):
        from_trl_config({"per_device_train_batch_size": 8})
    vllm = from_trl_config({"use_vllm": True, "delta": 4.0}, overrides={"train.rounds": 3})
    assert vllm.overrides == {"train.rollout_engine": "vllm", "train.rounds": 3}
    assert "not privacy.delta" in vllm.notes[0]
