"""Issue 56: finite by construction. Bad sizes, counts and weights are refused at load with one
ConfigError naming the key; a step whose update or weights would be non-finite is skipped
(charged, counted, weights and AdamW state as before); a non-finite adapter is never released."""

from __future__ import annotations

import json
import math
import typing

import pytest
import torch
from test_trainer import _adapter, tiny_config

from dpgrpo.config import RunConfig, load_config
from dpgrpo.config import values as config_values
from dpgrpo.errors import ConfigError, ReleaseError
from dpgrpo.privacy.mechanism import privatize
from dpgrpo.privacy.noise import NoiseSource
from dpgrpo.training.trainer import apply_update, train

BAD = [  # (TOML, the key the error names, what it says)
    ("[privacy]\nclip_norm = 1e308", "privacy.clip_norm", "at most 1e6, got 1e308"),
    ("[privacy]\nclip_norm = 1e30", "privacy.clip_norm", "at most 1e6, got 1e30"),
    ("[privacy]\nclip_norm = inf", "privacy.clip_norm", "finite"),
    ("[train]\nlearning_rate = 1e38", "train.learning_rate", "at most 1, got 1e38"),
    ("[train]\nrounds = 99999999999999999999", "train.rounds",
     "at most 1000000, got 99999999999999999999"),
    ("[model]\nlora_layers = []", "model.lora_layers", "adapts no layer"),
    ("[model]\nlora_layers = [0, 0]", "model.lora_layers", "duplicates"),
    ("[privacy]\nseed = 99999999999999999999", "privacy.seed", "at most"),
    ("[data]\nn_slots = 10000000000000", "data.n_slots", "at most 1000000000000"),
    ("[audit]\ncanaries = 10000000000000", "audit.canaries", "at most"),
]


@pytest.mark.parametrize("toml, key, says", BAD, ids=[b[1] + ":" + b[0].split("= ")[1]
                                                      for b in BAD])
def test_each_bad_value_is_one_config_error_naming_its_key(tmp_path, toml, key, says):
    path = tmp_path / "run.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert key in message and says in message and "\n" not in message


@pytest.mark.parametrize("toml", ["[privacy]\nclip_norm = 1e6", "[train]\nlearning_rate = 1.0",
                                  "[train]\nrounds = 1000000", "[model]\nlora_layers = [-1]"])
def test_the_bounds_themselves_are_accepted(tmp_path, toml):
    path = tmp_path / "run.toml"
    path.write_text(toml + "\n")
    load_config(path)


#: numeric keys whose upper bound is checked in __post_init__ instead (with the reason)
BOUNDED_ELSEWHERE = {"model.lora_dropout", "privacy.delta", "train.top_p", "privacy.group_sizes"}


def test_every_numeric_key_has_an_upper_bound_in_one_table():
    hints = {name: typing.get_type_hints(type(getattr(RunConfig(), name)))
             for name in ("model", "data", "privacy", "train", "audit")}
    numeric = {f"{section}.{key}" for section, types in hints.items()
               for key, kind in types.items()
               if set(typing.get_args(kind) or (kind,)) & {int, float}}
    assert numeric - BOUNDED_ELSEWHERE <= set(config_values.MAXIMA)
    assert "train.rounds" in numeric and "privacy.clip_norm" in numeric


def test_a_nan_reward_weight_is_refused_before_any_round_is_charged(tiny_model_dir, tmp_path):
    import dpgrpo

    with pytest.raises(ConfigError, match=r"'custom': reward_weights must be finite.*got \[nan\]"):
        dpgrpo.train(model=str(tiny_model_dir), problems=[{"question": f"{i} + 1?",
                                                           "answer": str(i + 1)}
                                                          for i in range(6)],
                     rewards=lambda completion, problem: 1.0, reward_weights=[math.nan],
                     n_slots=6, out=tmp_path / "run",
                     overrides={"model.device": "cpu", "privacy.noise_multiplier": 1.0,
                                "train.rounds": 1, "train.group_size": 2,
                                "train.max_new_tokens": 4, "privacy.expected_batch": 2})
    assert not (tmp_path / "run").exists()                # nothing charged, nothing left
    with pytest.raises(ConfigError, match="magnitude at most 1e6"):
        config_values.check_weights([1.0, -1e7])
    config_values.check_weights([1.0, -1e6])


def test_an_update_that_overflows_in_fp32_skips_the_step_and_keeps_the_weights(
        tiny_model_dir, tmp_path, monkeypatch):
    """clip_norm = 1e308 (the bound lifted): the fp64 update is finite, its fp32 cast is not.
    Before issue 56 this released an all-NaN adapter as releasable with 0 steps skipped."""
    import dpgrpo.training.trainer as trainer
    from dpgrpo.training.grads import trainable_parameters

    monkeypatch.setitem(config_values.MAXIMA, "privacy.clip_norm", math.inf)
    seen, build = {}, trainer.build_run

    def spy(config, run_dir, ctx=None):
        run = build(config, run_dir, ctx)
        seen["run"] = run
        seen["start"] = {k: v.detach().clone()
                         for k, v in trainable_parameters(run.model).items()}
        return run

    monkeypatch.setattr(trainer, "build_run", spy)
    cfg = tiny_config(tiny_model_dir, "privacy.clip_norm=1e308", "train.rounds=2",
                      "privacy.seed=7")
    result = train(cfg, tmp_path / "run")
    assert result.steps_skipped == 2 and result.certificate["rounds_charged"] == 2
    rows = [json.loads(x) for x in
            (tmp_path / "run" / "recovery" / "telemetry.jsonl").read_text().splitlines()]
    assert [(r["step_skipped"], r["update_norm"]) for r in rows] == [(True, None)] * 2
    run = seen["run"]
    now = trainable_parameters(run.model)
    assert all(torch.equal(now[k], v) for k, v in seen["start"].items())  # as before
    assert all(not s for s in run.optimizer.state.values())              # no AdamW state
    released = _adapter(tmp_path / "run")
    assert released and all(bool(t.isfinite().all()) for t in released.values())
    assert all(float(t.abs().sum()) == 0 for k, t in released.items() if "lora_B" in k)


def test_a_step_that_makes_a_weight_non_finite_is_undone_with_its_adamw_state():
    model = torch.nn.Linear(3, 2, bias=False)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    one = {"weight": torch.ones(2, 3, dtype=torch.float64)}
    assert apply_update(model, adamw, one) == pytest.approx(math.sqrt(6))
    weight = model.weight.detach().clone()
    state = {k: v.clone() for k, v in adamw.state[model.weight].items()}

    def unchanged() -> bool:
        return torch.equal(model.weight, weight) and all(
            torch.equal(v, adamw.state[model.weight][k]) for k, v in state.items())

    huge = {"weight": torch.full((2, 3), 1e308, dtype=torch.float64)}
    assert apply_update(model, adamw, huge) is None and unchanged()  # inf once cast to fp32
    nan = {"weight": torch.full((2, 3), math.nan)}
    assert apply_update(model, adamw, nan) is None and unchanged()
    for lr in (1e38, 3e38):                                  # the step itself overflows
        adamw.param_groups[0]["lr"] = lr
        assert apply_update(model, adamw, one) is None and unchanged() and model.weight.grad is None
    adamw.param_groups[0]["lr"] = 1e-3
    assert apply_update(model, adamw, one) is not None and not torch.equal(model.weight, weight)

    class Counting(torch.optim.SGD):
        steps = 0

        def step(self, closure=None):
            Counting.steps += 1
            return super().step(closure)

    counting = Counting(model.parameters(), lr=1.0)
    for bad in (1e308, math.inf, math.nan):                  # refused before the step
        update = {"weight": torch.full((2, 3), bad, dtype=torch.float64)}
        assert apply_update(model, counting, update) is None
    assert Counting.steps == 0 and model.weight.grad is None
    fresh = torch.optim.SGD(model.parameters(), lr=1e38)      # a weight of 1e38 * 1e10: inf
    before = model.weight.detach().clone()
    assert apply_update(model, fresh, {"weight": torch.full((2, 3), 1e10)}) is None
    assert torch.equal(model.weight, before) and not fresh.state


def test_the_clipped_sum_and_the_division_by_q_n_are_checked():
    grads = {"w": torch.full((4, 3), 1e308, dtype=torch.float64)}  # records finite, sum not
    summed = privatize(grads, clip_norm=math.inf, noise_multiplier=0.0, expected_batch=4.0,
                       noise=NoiseSource(seed=1))
    assert not summed.sum_finite and not summed.finite
    small = privatize({"w": torch.full((1, 3), 1e300, dtype=torch.float64)}, clip_norm=math.inf,
                      noise_multiplier=0.0, expected_batch=1e-10, noise=NoiseSource(seed=1))
    assert small.sum_finite and not small.finite             # 1e300 / 1e-10 overflows
    fine = privatize({"w": torch.ones(2, 3)}, clip_norm=1.0, noise_multiplier=0.0,
                     expected_batch=2.0, noise=NoiseSource(seed=1))
    assert fine.finite and torch.allclose(fine.update["w"], torch.full((3,), 1 / math.sqrt(3),
                                                                       dtype=torch.float64))


def _peft_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))


def test_a_release_with_a_nan_tensor_is_refused_and_the_old_one_kept(tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    from dpgrpo.release import write
    from dpgrpo.release.publish import check_publishable

    model, release = _peft_model(tiny_model_dir), tmp_path / "release"
    cert = {"epsilon": 1.0, "releasable": True}
    write.write_release(release, model=model, config={}, certificate=cert)
    before = (release / "adapter_model.safetensors").read_bytes()
    check_publishable(release)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n)[0, 0] = math.nan
    with pytest.raises(ReleaseError, match="non-finite weights: 1 tensor"):
        write.write_release(release, model=model, config={}, certificate=cert)
    assert (release / "adapter_model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["release"]  # no half-built folder left
    monkeypatch.setattr(write, "check_finite_adapter", lambda path: None)  # an old release
    write.write_release(release, model=model, config={}, certificate=cert)
    monkeypatch.undo()
    with pytest.raises(ReleaseError, match="non-finite"):
        check_publishable(release, force=True)


def test_make_task_itself_refuses_a_non_finite_reward_weight():
    """The task refuses the weight where it is given (dpgrpo.make_task), not only the trainer."""
    import dpgrpo

    for bad in (math.nan, math.inf, 1e7):
        with pytest.raises(ConfigError, match=r"task 'custom': reward_weights must be finite"):
            dpgrpo.make_task([{"question": "1 + 1?", "answer": "2"}],
                             rewards=[lambda completion, problem: 1.0], reward_weights=[bad])
