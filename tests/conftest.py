"""Shared fixtures: the tiny random model, the benchmark data folder, thread limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DPGRPO_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    # Two cores, two xdist workers: one intra-op thread per worker.
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # ``cuda`` tests run where a GPU is present (``pytest -m cuda``, bench/gpu_suite.py) and
    # skip, with the reason, everywhere else: the CPU suite stays green and still collects them.
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The read-only benchmark folder (../shared/data beside the repo)."""
    if not (SHARED_DATA / "README.md").exists():
        pytest.fail(f"benchmark data not found at {SHARED_DATA}; set DPGRPO_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a tiny random Llama and its tokenizer (HF format)."""
    from dpgrpo.verify.fixtures import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


TINY_PROTOCOL_TOML = """
[model]
name = "{model}"
device = "cpu"
[data]
limit = 40
[privacy]
expected_batch = 4
noise_multiplier = 1.0
[train]
rounds = 2
group_size = 2
max_new_tokens = 4
checkpoint_every = 1
[protocol]
seeds = 2
eval_limit = 10
draws = 400
sign_draws = 400
"""


@pytest.fixture
def tiny_protocol_toml(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A protocol config for the tiny model: 40 prompts, 2 rounds, G = 2, 2 seeds, 10 evals."""
    path = tmp_path / "tiny-protocol.toml"
    path.write_text(TINY_PROTOCOL_TOML.format(model=tiny_model_dir))
    return path
