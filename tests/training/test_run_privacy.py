"""Release hygiene and public constants of a run: the certificate and release config hold only
allow-listed keys, a round is charged before its work, q = m/n with absent canary slots, n and
delta are public, the noise-tail term is certified, and progress shows public values only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpgrpo.config import (
    AuditConfig,
    DataConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    embedded_default,
)
from dpgrpo.errors import PrivacyBudgetError, PrivacyError
from dpgrpo.training.trainer import train

CANARY_BITS = [True, False, True, False, False, True]  # 3 of 6 canaries present, fixed

CERTIFICATE_KEYS = {
    "epsilon", "delta", "delta_pld", "noise_tail_delta", "private", "arm", "q", "sigma",
    "clip_norm", "n", "n_source", "expected_batch", "rounds", "rounds_retained", "rounds_charged",
    "rounds_replayed", "crashes", "neighbouring_relation", "unit", "accountant",
    "accountant_version", "rdp_epsilon", "rdp_order", "ledger", "seeded", "releasable", "noise",
    "noise_generator", "trainable_coordinates", "model", "task", "group_size", "canary_slots",
    "dpgrpo_version", "assumptions", "budget_independent_of", "shared_budget", "replace_one",
    "group_privacy", "target_epsilon", "not_releasable_because", "record_isolation",
    "adapter",  # what trained, what stayed frozen, the public warm start (issue 26)
    "record_randomness",
    "files_sha256",  # sha256 of the released adapter files (issue 33): public, like the files
}
NESTED_KEYS = {"events", "sampling_rate", "noise_multiplier", "count", "A1", "A2", "A3", "A4",
               "relation", "group", "method", "basis", "meaningful", "gradients", "rollouts",
               "rollout_mode", "rollout_engine", "verifier",
               "lora_train", "trains", "lora_rank", "lora_bias", "target_modules", "lora_layers",
               "init_adapter", "path", "sha256", "keep", "public_input",
               "kl_reference", "kl_reference_is",  # public config: the KL term's reference
               "adapter_model.safetensors", "adapter_config.json"}


def tiny_config(model_dir, *extra: str) -> RunConfig:
    base = [f"model.name={model_dir}", "model.device=cpu", "data.limit=40",
            "privacy.expected_batch=4", "privacy.noise_multiplier=1.0", "train.rounds=2",
            "train.group_size=2", "train.max_new_tokens=4", "train.checkpoint_every=1"]
    return apply_overrides(embedded_default(), base + list(extra))


def _keys(obj) -> set:
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj)) if obj else set()
    return set()


def _journal_rates(run_dir) -> list[float]:
    lines = (run_dir / "recovery" / "journal.jsonl").read_text().splitlines()
    return [json.loads(x)["sampling_rate"] for x in lines if x.strip()]


@pytest.fixture(scope="module")
def canary_run(tiny_model_dir, tmp_path_factory):
    """A 2-round run with 6 canary slots, exactly 3 of them present (fixed bits)."""
    from dpgrpo.training import setup as run_setup

    run_dir, seen, calls = tmp_path_factory.mktemp("canary") / "run", {}, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dpgrpo.training.canaries.draw_inclusion",
                   lambda k, generator=None: CANARY_BITS[:k])
        original = run_setup.build_run

        def spy(config, run_dir, ctx=None):
            seen["run"] = original(config, run_dir, ctx)
            return seen["run"]

        mp.setattr("dpgrpo.training.trainer.build_run", spy)
        result = train(tiny_config(tiny_model_dir, "audit.canaries=6"), run_dir,
                       progress=calls.append)
    return result, seen["run"], calls


def test_q_is_m_over_all_n_slots_with_absent_canaries(canary_run):
    result, run, _ = canary_run
    present = sum(slot is not None for slot in run.slots)
    assert present == 43 and len(run.slots) == run.n == 46  # 40 problems + 3 of 6 canaries
    cert = result.certificate
    assert cert["n"] == 46 and cert["canary_slots"] == 6 and cert["delta_pld"] == 1 / 460
    assert cert["q"] == 4 / 46 and run.sampler.q == 4 / 46 and run.sampler.n == 46
    assert _journal_rates(result.run_dir) == [4 / 46, 4 / 46]


def test_release_holds_only_allow_listed_keys(canary_run):
    result, _, _ = canary_run
    release = result.run_dir / "release"
    cert = json.loads((release / "certificate.json").read_text())
    assert set(cert) <= CERTIFICATE_KEYS, sorted(set(cert) - CERTIFICATE_KEYS)
    allowed = CERTIFICATE_KEYS | NESTED_KEYS
    assert _keys(cert) <= allowed, sorted(_keys(cert) - allowed)
    config = json.loads((release / "dpgrpo_config.json").read_text())
    classes = {"model": ModelConfig, "data": DataConfig, "privacy": PrivacyConfig,
               "train": TrainConfig, "audit": AuditConfig}
    sections = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in classes.items()}
    sections["privacy"] = (sections["privacy"] - {"seed"}) | {"seeded"}
    assert set(config) == set(sections)
    for name, keys in sections.items():  # the public configuration, nothing computed
        assert set(config[name]) == keys, name
        assert not any(isinstance(v, dict) for v in config[name].values())


def test_certificate_states_the_noise_tail_n_source_and_crash_policy(canary_run):
    result, run, _ = canary_run
    cert = result.certificate
    lora = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    assert cert["trainable_coordinates"] == run.coordinates == lora > 0
    assert 0 < cert["noise_tail_delta"] < 1e-20
    assert cert["delta"] == cert["delta_pld"] + cert["noise_tail_delta"]
    assert cert["n_source"].startswith("data.limit") and "ChaCha20" in cert["noise_generator"]
    assert cert["rounds_replayed"] == 0 and "independent of the private data" in cert["crashes"]


def test_progress_shows_public_values_only_by_default(canary_run):
    _, _, calls = canary_run
    assert [c["round"] for c in calls] == [1, 2]
    assert all(set(c) == {"round", "rounds", "epsilon", "elapsed"} for c in calls)


def test_a_round_is_charged_before_its_rollouts(tiny_model_dir, tmp_path, monkeypatch):
    """An exception inside round 2's rollouts: round 2 is in the journal; the resume replays it
    and the certificate charges it twice."""
    from dpgrpo.rollout.transformers_engine import TransformersEngine

    real, calls = TransformersEngine.generate, []

    def crash_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected: out of memory during rollouts")
        return real(*args, **kwargs)

    monkeypatch.setattr(TransformersEngine, "generate", crash_on_second)
    cfg = tiny_config(tiny_model_dir, "data.limit=6", "privacy.expected_batch=6")  # q = 1
    with pytest.raises(RuntimeError, match="injected"):
        train(cfg, tmp_path / "run")
    assert _journal_rates(tmp_path / "run") == [1.0, 1.0]  # round 2 charged before it crashed
    calls_seen = []
    result = train(None, tmp_path / "run", resume=True, progress=calls_seen.append,
                   show_private=True)
    cert = result.certificate
    assert (cert["rounds_charged"], cert["rounds_retained"], cert["rounds_replayed"]) == (3, 2, 1)
    assert {"batch_size", "reward_mean"} <= set(calls_seen[0]) and calls_seen[0]["batch_size"] == 6


def test_delta_of_one_over_n_is_refused_for_releasable_runs(tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(PrivacyBudgetError, match="1/n"):
        train(tiny_config(tiny_model_dir, "privacy.delta=0.025"), tmp_path / "a")  # n = 40

    class Reached(Exception):
        pass

    def stop(*args, **kwargs):
        raise Reached

    monkeypatch.setattr("dpgrpo.model.load_policy", stop)  # reached: past the delta check
    accepted = [["privacy.delta=0.025", "privacy.seed=1"],  # seeded: not releasable anyway
                ["privacy.delta=0.03", "privacy.noise_multiplier=none", "train.arm=non-private"],
                ["privacy.delta=0.0249"]]
    for i, extra in enumerate(accepted):
        with pytest.raises(Reached):
            train(tiny_config(tiny_model_dir, *extra), tmp_path / f"ok{i}")


def test_a_large_noise_tail_term_is_refused_before_any_round(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    monkeypatch.setattr("dpgrpo.training.setup.noise_tail_delta", lambda d, t, eps: 1.0)
    with pytest.raises(PrivacyError, match="1%"):
        train(tiny_config(tiny_model_dir), tmp_path / "run")
    assert not (tmp_path / "run" / "recovery" / "journal.jsonl").exists()


def test_rollout_isolation_reaches_the_engine_and_the_certificate(tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """train.rollout_isolation = "isolated": every rollout call of the run is isolated, with
    training's bounded rows, and the certificate states the engine and the mode that ran."""
    from dpgrpo.rollout.transformers_engine import ISOLATED, TransformersEngine

    real, seen = TransformersEngine.generate, []

    def spy(self, *args, **kwargs):
        seen.append((self.isolated, self.rows_per_call))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TransformersEngine, "generate", spy)
    cfg = tiny_config(tiny_model_dir, "train.rollout_isolation=isolated")
    cert = train(cfg, tmp_path / "run").certificate
    assert seen and all(iso and rows == cfg.train.rollout_rows(4) for iso, rows in seen)
    assert cert["record_isolation"]["rollouts"] == ISOLATED
    assert (cert["record_isolation"]["rollout_mode"],
            cert["record_isolation"]["rollout_engine"]) == ("isolated", "transformers")


def test_vllm_rollouts_are_refused_on_cpu_before_any_round(tiny_model_dir, tmp_path,
                                                           monkeypatch):
    from dpgrpo.errors import ConfigError
    from dpgrpo.rollout import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    with pytest.raises(ConfigError, match="CUDA"):
        train(tiny_config(tiny_model_dir, "train.rollout_engine=vllm"), tmp_path / "run")
    assert not (tmp_path / "run" / "recovery" / "journal.jsonl").exists()


def _gsm8k_dir(tmp_path, rows: int, invalid: set[int]):
    folder = tmp_path / "data" / "gsm8k"
    folder.mkdir(parents=True)
    lines = []
    for i in range(rows):
        answer = "no final answer" if i in invalid else f"{i} + 1 = {i + 1}\n#### {i + 1}"
        lines.append(json.dumps({"question": f"What is {i} + 1?", "answer": answer}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "data"


@pytest.mark.parametrize("extra, n, source, present", [
    ([], 10, "source rows", 7),                        # invalid rows stay counted in n
    (["data.limit=8"], 8, "data.limit", 7),            # a capacity: one slot left absent
    (["data.limit=5"], 5, "data.limit", 5),
    (["data.n_slots=30"], 30, "data.n_slots", 7),
])
def test_n_is_fixed_by_public_configuration(tmp_path, extra, n, source, present):
    from dpgrpo.tasks import get_task
    from dpgrpo.training.distributed import DistContext
    from dpgrpo.training.setup import _slots

    data = _gsm8k_dir(tmp_path, 10, invalid={1, 4, 8})
    cfg = apply_overrides(embedded_default(), ["data.task=gsm8k", f"data.data_dir={data}",
                                               "data.skip_invalid=true", "data.limit=none", *extra])
    slots, count = _slots(cfg, get_task("gsm8k"), tmp_path / "run", DistContext())
    assert (count.n, count.source, len(slots)) == (n, source, n)
    assert sum(s is not None for s in slots) == present


def test_show_private_telemetry_flag_warns(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from dpgrpo.cli import app

    args = ["train", "--set", f"model.name={tiny_model_dir}", "--set", "model.device=cpu",
            "--set", "data.limit=40", "--set", "privacy.expected_batch=4", "--set",
            "privacy.noise_multiplier=1.0", "--rounds", "1", "--set", "train.group_size=2",
            "--set", "train.max_new_tokens=3", "--set", "train.checkpoint_every=1",
            "-o", str(tmp_path / "run"), "--quiet", "--show-private-telemetry"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "WARNING" in out.output and "NOT covered by the privacy guarantee" in out.output


def test_certificate_adds_the_tail_term_to_delta(canary_run, monkeypatch):
    from dpgrpo.privacy.accounting import PrivacyLedger
    from dpgrpo.release.certificate import certificate

    _, run, _ = canary_run
    monkeypatch.setattr("dpgrpo.release.certificate.noise_tail_delta",
                        lambda d, rounds, eps: 1e-6 * rounds)
    ledger = PrivacyLedger()
    ledger.record(run.q, run.sigma, 3)  # e.g. one replayed round: the term grows with it
    cert = certificate(run, ledger, 2)
    assert cert["noise_tail_delta"] == 3e-6 and cert["delta_pld"] == 1 / 460
    assert cert["delta"] == 1 / 460 + 3e-6 and cert["rounds_replayed"] == 1


@pytest.mark.parametrize("preset, n", [("math", 6988), ("gsm8k", 6961)])
def test_paper_presets_fix_n_by_their_public_limit(shared_data_dir, tmp_path, preset, n):
    from pathlib import Path

    from dpgrpo.config import load_config
    from dpgrpo.tasks import get_task
    from dpgrpo.training.distributed import DistContext
    from dpgrpo.training.setup import _slots

    path = Path(__file__).resolve().parents[2] / "configs" / f"{preset}.toml"
    cfg = load_config(path, [f"data.data_dir={shared_data_dir}"])
    assert cfg.data.skip_invalid and cfg.data.limit == n
    slots, count = _slots(cfg, get_task(preset), tmp_path, DistContext())
    assert (count.n, count.source, len(slots)) == (n, "data.limit", n)
    assert all(slot is not None for slot in slots)  # enough valid records to fill the capacity
