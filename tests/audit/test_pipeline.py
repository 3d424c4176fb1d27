"""End-to-end audits of a fabricated run directory (tiny model, random LoRA release)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audit_toy import make_toy_run, toy_problems, write_jsonl
from dpgrpo.audit.one_run import lower_bound_from_counts
from dpgrpo.audit.pipeline import read_candidates, read_run, run_canary_audit, run_mia
from dpgrpo.audit.report import write_canary_report, write_mia_report
from dpgrpo.audit.scoring import SamplingSettings
from dpgrpo.errors import ConfigError, DataError, ReleaseError

SETTINGS = SamplingSettings(n_samples=2, max_new_tokens=4)


@pytest.fixture(scope="module")
def toy_run(tiny_model_dir, tmp_path_factory):
    return make_toy_run(tmp_path_factory.mktemp("run"), tiny_model_dir, n_canaries=12)


def test_read_run_and_candidates(toy_run, tmp_path):
    run = read_run(toy_run)
    assert (run.epsilon, run.delta, run.task_name) == (8.0, 1e-5, "audit-toy")
    path = write_jsonl(tmp_path / "m.jsonl", toy_problems("m", 3), task="audit-toy")
    cands = read_candidates(path)
    assert [(p.id, t) for p, t in cands] == [("m-0", "audit-toy"), ("m-1", "audit-toy"),
                                             ("m-2", "audit-toy")]
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "question": "q"}\n')
    with pytest.raises(DataError, match="line 1, field 'answer'"):
        read_candidates(tmp_path / "bad.jsonl")


def test_the_certificate_ledger_gives_the_auc_ceiling(tiny_model_dir, tmp_path):
    """One Gaussian round at sigma 1 without subsampling is 1-GDP: ceiling Phi(1 / sqrt 2)."""
    from dpgrpo.privacy.tradeoff import gaussian_auc

    run_dir = make_toy_run(tmp_path / "run", tiny_model_dir)
    cert_path = run_dir / "release" / "certificate.json"
    cert = json.loads(cert_path.read_text())
    cert["ledger"] = {"neighbouring_relation": "add-or-remove-one",
                      "events": [{"sampling_rate": 1.0, "noise_multiplier": 1.0, "count": 1}]}
    cert_path.write_text(json.dumps(cert))
    ceiling = read_run(run_dir).auc_ceiling
    assert gaussian_auc(1.0) <= ceiling <= gaussian_auc(1.0) + 1e-3
    cert["ledger"]["events"][0]["noise_multiplier"] = 0.0            # a noiseless release
    cert_path.write_text(json.dumps(cert))
    assert read_run(run_dir).auc_ceiling == 1.0


def test_mia_end_to_end(toy_run, tmp_path):
    mem = write_jsonl(tmp_path / "members.jsonl", toy_problems("m", 10))
    non = write_jsonl(tmp_path / "nonmembers.jsonl", toy_problems("n", 10, start=10))
    out = run_mia(toy_run, mem, non, settings=SETTINGS, seed=0, n_folds=3, n_estimators=5)
    assert out.features.shape == (20, 6) and out.labels.sum() == 10
    assert np.isfinite(out.result.unified.oof_scores).all()
    paths = write_mia_report(tmp_path / "out", out)
    summary = json.loads(paths["summary.json"].read_text())
    folds = summary["diba"]["folds"]
    assert summary["diba"]["mean"]["auc"] == pytest.approx(np.mean([f["auc"] for f in folds]))
    assert 0.0 <= summary["diba"]["mean"]["auc"] <= 1.0
    assert (summary["n_members"], summary["n_nonmembers"], summary["seed"]) == (10, 10, 0)
    assert {h["subset"] for h in summary["hardness"]} == {"All-0", "All-1", "Residual", "Unified"}
    assert sum(h["n_samples"] for h in summary["hardness"][:3]) == 20
    assert len(summary["baselines"]) == 8
    assert paths["roc.png"].read_bytes()[:4] == b"\x89PNG"
    assert "Hardness split" in paths["report.md"].read_text()
    assert summary["certified_auc_ceiling"] is None                   # the toy has no ledger
    assert "no AUC ceiling" in paths["report.md"].read_text()
    rows = [json.loads(line) for line in paths["candidates.jsonl"].read_text().splitlines()]
    assert len(rows) == 20 and rows[0]["member"] == 1 and "loss_calibrated" in rows[0]["baselines"]
    with pytest.raises(ReleaseError):
        write_mia_report(toy_run / "release" / "audit", out)


def test_a_stopping_rule_outside_the_permutations_is_refused_before_sampling(toy_run, tmp_path,
                                                                             monkeypatch):
    import dpgrpo.audit.pipeline as pipeline

    mem = write_jsonl(tmp_path / "members.jsonl", toy_problems("m", 3))
    non = write_jsonl(tmp_path / "nonmembers.jsonl", toy_problems("n", 3, start=3))
    monkeypatch.setattr(pipeline, "_load_release", lambda *a: pytest.fail("sampled"))
    for h in (0, 6):
        with pytest.raises(ConfigError, match=r"stop_after must be between 1 and the "
                                              r"permutations \(5\)"):
            run_mia(toy_run, mem, non, n_folds=3, permutations=5, stop_after=h)


def test_canary_end_to_end(toy_run, tmp_path):
    out = run_canary_audit(toy_run, k_plus=3, k_minus=3, confidence=0.9, settings=SETTINGS)
    a = out.audit
    assert (a.m, a.r, a.k_plus, a.delta) == (12, 6, 3, 1e-5)
    assert a.epsilon_lower_bound == lower_bound_from_counts(12, 6, a.v, delta=1e-5,
                                                            confidence=0.9)
    paths = write_canary_report(tmp_path / "canary", out)
    summary = json.loads(paths["summary.json"].read_text())
    assert summary["certified_epsilon"] == 8.0
    assert summary["empirical_epsilon_lower_bound"] == a.epsilon_lower_bound
    assert "included" not in summary
    rows = [json.loads(line) for line in paths["canaries.jsonl"].read_text().splitlines()]
    top = sorted(rows, key=lambda r: -r["score"])
    v = sum(r["included"] for r in top[:3]) + sum(not r["included"] for r in top[-3:])
    assert v == a.v
    with pytest.raises(ConfigError, match="k_plus"):
        run_canary_audit(toy_run, k_plus=10, k_minus=3, settings=SETTINGS)


def test_base_samples_are_drawn_once_and_shared_by_audits(toy_run, tiny_model_dir, tmp_path,
                                                          monkeypatch):
    """The base's side of DIBA, drawn once into a file (alone, or by a first audit), is read by
    later audits of any release of that base: the same features, bit for bit, as drawing it in
    place, and the base is not sampled again. A file drawn for other candidates, settings or
    seed is refused, naming what differs."""
    from dpgrpo.audit import pipeline
    from dpgrpo.audit.pipeline import base_samples

    mem = write_jsonl(tmp_path / "members.jsonl", toy_problems("m", 6), task="audit-toy")
    non = write_jsonl(tmp_path / "nonmembers.jsonl", toy_problems("n", 6, start=6),
                      task="audit-toy")
    kw = dict(settings=SETTINGS, seed=3, n_folds=3, n_estimators=5, baselines=False)
    in_place = run_mia(toy_run, mem, non, **kw)
    other = make_toy_run(tmp_path / "other", tiny_model_dir, seed=1)     # another release
    alone = tmp_path / "alone.json"
    rewards = base_samples(alone, str(tiny_model_dir), mem, non, settings=SETTINGS, seed=3)
    assert len(rewards) == 12 and all(len(r) == SETTINGS.n_samples for r in rewards)
    first = tmp_path / "by-audit.json"
    run_mia(other, mem, non, base_samples=first, **kw)                  # draws and writes it
    assert json.loads(first.read_text())["rewards"] == json.loads(alone.read_text())["rewards"]
    calls: list[int] = []
    real = pipeline.base_rewards
    monkeypatch.setattr(pipeline, "base_rewards", lambda *a, **k: calls.append(1) or real(*a, **k))
    for path in (alone, first):
        shared = run_mia(toy_run, mem, non, base_samples=path, **kw)
        assert calls == []                                           # the base did not sample
        np.testing.assert_array_equal(shared.features, in_place.features)
    base_col = in_place.features[:, 1]                               # base_score: from the file
    assert base_col.tolist() == [sum(r) / len(r) for r in rewards]
    with pytest.raises(ConfigError, match="seed = 3, this audit has 4"):
        run_mia(toy_run, mem, non, base_samples=alone, **{**kw, "seed": 4})
    with pytest.raises(ConfigError, match="candidates_sha256"):
        run_mia(toy_run, non, mem, base_samples=alone, **kw)           # other candidates
    with pytest.raises(ConfigError, match="settings"):
        run_mia(toy_run, mem, non, base_samples=alone,
                **{**kw, "settings": SamplingSettings(n_samples=2, max_new_tokens=5)})
    alone.write_text("{not json")
    with pytest.raises(DataError, match="unreadable base samples"):
        run_mia(toy_run, mem, non, base_samples=alone, **kw)
