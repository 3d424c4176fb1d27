"""`dpgrpo tune` (issue 26): settings chosen on a public proxy at the private run's budget,
without ever opening the private data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dpgrpo.config import load_config
from dpgrpo.errors import ConfigError, PrivacyError, PublicDataError
from dpgrpo.experiments.tune import (
    GridPoint,
    TuneSettings,
    check_proxy,
    load_tune,
    private_slots,
    proxy_config,
    run_tune,
)


def _private(tmp_path: Path, *extra: str):
    """A private GSM8K-format file run: the data a tune must never read."""
    folder = tmp_path / "private"
    (folder / "gsm8k").mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"Secret {i}: what is {i} + 1?", "answer": f"{i} + 1\n#### {i + 1}"}
            for i in range(30)]
    (folder / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, load_config(None, ["data.task=gsm8k", f"data.data_dir={folder}", *extra])


def _public(tmp_path: Path, questions: list[str]) -> Path:
    """A GSM8K-format public folder with ``questions`` in its train and eval splits."""
    folder = tmp_path / "public"
    (folder / "gsm8k").mkdir(parents=True, exist_ok=True)
    rows = "".join(json.dumps({"question": q, "answer": "1\n#### 1"}) + "\n" for q in questions)
    for split in ("train", "test"):
        (folder / "gsm8k" / f"{split}.jsonl").write_text(rows)
    return folder


def test_the_proxy_may_not_be_the_private_data(tmp_path):
    folder, config = _private(tmp_path, "data.n_slots=40")
    with pytest.raises(PrivacyError, match="private run's own data"):
        check_proxy(config, TuneSettings(proxy="gsm8k"))
    with pytest.raises(PrivacyError, match="private run's own data"):
        check_proxy(config, TuneSettings(proxy="gsm8k", proxy_data_dir=str(folder / ".")))
    public = _public(tmp_path, [f"Public {i}: what is {i} + 2?" for i in range(20)])
    check_proxy(config, TuneSettings(proxy="gsm8k", proxy_data_dir=str(public)))
    check_proxy(config, TuneSettings(proxy="arithmetic-2"))
    arithmetic = load_config(None, ["data.task=arithmetic"])
    with pytest.raises(PrivacyError, match="own \\(generated\\) task"):  # issue 56: it was accepted
        check_proxy(arithmetic, TuneSettings(proxy="arithmetic"))
    check_proxy(arithmetic, TuneSettings(proxy="arithmetic-proxy"))   # disjoint by content


def test_a_proxy_holding_private_questions_is_refused_by_content(tmp_path):
    """Another name is not enough (issue 56): a proxy whose questions are in the private
    training set, up to case and whitespace or by a shared 13-word run, is refused with the
    count; a disjoint one is accepted."""
    _, config = _private(tmp_path, "data.n_slots=40")
    copies = ["SECRET 3:  what is 3 + 1", "secret 17: What is 17 + 1?",
              "Secret 29: what is 29 + 1?"]
    public = _public(tmp_path, copies + [f"Public {i}: what is {i} + 2?" for i in range(27)])
    with pytest.raises(PublicDataError, match=r"proxy 'gsm8k', split 'train': 3 of its 30 "
                                              r"questions are in the private training set"):
        check_proxy(config, TuneSettings(proxy="gsm8k", proxy_data_dir=str(public)))
    # level 2 draws level 1's sums of 2..5 too: 137 of its 1,000 training questions (34 word
    # for word) are in the private arithmetic training split
    arithmetic = load_config(None, ["data.task=arithmetic"])
    with pytest.raises(PublicDataError, match=r"137 of its 1000 questions .*; 34 equal"):
        check_proxy(arithmetic, TuneSettings(proxy="arithmetic-2"))


def test_n_comes_from_the_config_never_from_the_private_file(tmp_path):
    _, config = _private(tmp_path)
    with pytest.raises(ConfigError, match=r"set data.n_slots"):
        private_slots(config)
    assert private_slots(_private(tmp_path, "data.n_slots=40")[1]) == 40
    assert private_slots(load_config(None, ["data.task=arithmetic"])) == 1000


@pytest.mark.parametrize("key", ["privacy.epsilon=4", "train.rounds=3", "data.limit=5",
                                 "privacy.noise_multiplier=2", "train.arm=non-private"])
def test_a_grid_point_cannot_change_the_budget_or_the_data(key):
    with pytest.raises(ConfigError, match="epsilon, delta, n and T are the private run's"):
        GridPoint("p", (key,))


def test_the_proxy_run_keeps_n_delta_and_T_and_recalibrates_sigma(tmp_path):
    _, config = _private(tmp_path, "data.n_slots=40", "privacy.noise_multiplier=0.9",
                         "audit.canaries=4")
    point = GridPoint("b", ("model.lora_train=B", "privacy.expected_batch=6"))
    cfg = proxy_config(config, TuneSettings(proxy="arithmetic-2"), point, 40)
    assert (cfg.data.task, cfg.data.n_slots, cfg.data.limit) == ("arithmetic-2", 40, 40)
    assert cfg.data.data_dir is None
    assert cfg.privacy.delta == pytest.approx(1 / 400) and cfg.privacy.noise_multiplier is None
    assert cfg.train.rounds == config.train.rounds and cfg.audit.canaries == 0
    assert cfg.model.lora_train == "B" and cfg.privacy.expected_batch == 6


def test_tune_opens_the_private_data_only_to_compare_it(tiny_model_dir, tmp_path, monkeypatch):
    folder, _ = _private(tmp_path)
    toml = tmp_path / "private.toml"
    toml.write_text(f"""
[model]
name = "{tiny_model_dir}"
device = "cpu"
lora_rank = 1
[data]
task = "gsm8k"
data_dir = "{folder}"
n_slots = 40
[privacy]
epsilon = 8.0
expected_batch = 4
[train]
rounds = 1
group_size = 2
max_new_tokens = 4
[tune]
proxy = "arithmetic-2"
eval_limit = 3
eval_batch_size = 3
[tune.grid]
all = []
ffa = ["model.lora_train=B", "train.learning_rate=3e-2"]
""")
    config, settings = load_tune(toml)
    opened: list[tuple[str, bool]] = []
    private = str(folder.resolve())
    checking = [False]

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, Path)):
            path = str(Path(args[0] if not isinstance(args[0], bytes) else args[0].decode()))
            if path.startswith(private) or str(Path(path).resolve()).startswith(private):
                opened.append((path, checking[0]))

    def check(*args):
        checking[0] = True
        try:
            return check_proxy(*args)
        finally:
            checking[0] = False

    monkeypatch.setattr("dpgrpo.experiments.tune.check_proxy", check)
    sys.addaudithook(hook)  # cannot be removed: it only records, and only the private folder
    result = run_tune(config, settings, tmp_path / "tune")
    # the content check (issue 56) reads the private training file; nothing else opens it
    assert opened and all(during_check for _, during_check in opened)
    data = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert data["privacy_cost"].startswith("zero") and data["n"] == 40
    assert [p["name"] for p in data["points"]] == ["all", "ffa"]
    assert data["chosen"] == result.chosen in ("all", "ffa")
    all_, ffa = result.points
    assert ffa.trainable_params < all_.trainable_params and ffa.sigma == all_.sigma
    assert all_.epsilon == pytest.approx(8.0, abs=1e-3)
    chosen = load_config(result.chosen_config)
    assert (chosen.data.task, chosen.data.data_dir, chosen.data.n_slots) == (
        "gsm8k", str(folder), 40)
    assert chosen.model.lora_train == ("B" if result.chosen == "ffa" else "all")


def test_seeds_train_each_point_that_many_times_and_score_their_mean(tiny_model_dir, tmp_path):
    """``tune.seeds = 2``: two runs per point, in folders of their own, each with its own
    certificate and evaluation; the point's accuracy is their mean, and the table shows both."""
    from dpgrpo.experiments.tune import grid_table
    from dpgrpo.rundir.layout import RunDir

    config = load_config(None, [f"model.name={tiny_model_dir}", "model.device=cpu",
                                "model.lora_rank=1", "data.n_slots=40", "privacy.epsilon=8",
                                "privacy.expected_batch=4", "train.rounds=1",
                                "train.group_size=2", "train.max_new_tokens=4"])
    settings = TuneSettings(proxy="arithmetic-proxy", eval_limit=5, eval_batch_size=5, seeds=2,
                            grid=(GridPoint("all"),))
    result = run_tune(config, settings, tmp_path / "tune")
    runs = [tmp_path / "tune" / "points" / "all" / "runs" / f"dp-grpo-seed{k}" for k in (1, 2)]
    certs = [RunDir(r).certificate() for r in runs]
    assert all(c is not None and c["epsilon"] == pytest.approx(8.0, abs=1e-3) for c in certs)
    scores = [json.loads((r / "eval" / "summary.json").read_text())["accuracy"]["strict"]
              for r in runs]
    point, = result.points
    assert point.accuracies == tuple(scores)
    assert point.accuracy == pytest.approx(sum(scores) / 2)
    assert json.loads((tmp_path / "tune" / "tune.json").read_text())["seeds"] == 2
    if scores[0] != scores[1]:
        assert f"{100 * scores[0]:.1f} / {100 * scores[1]:.1f}" in grid_table(result)


def test_tune_seeds_must_be_positive():
    with pytest.raises(ConfigError, match="seeds"):
        TuneSettings(proxy="arithmetic-proxy", seeds=0)
