"""Packaging: torch as a range, gguf only as an extra with a clear error when missing,
datasets in `all`, sympy declared, one version."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import dpgrpo
from dpgrpo.errors import ConfigError

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_dependencies_and_extras():
    project = PYPROJECT["project"]
    core = _names(project["dependencies"])
    assert "gguf" not in core and {"sympy", "torch", "huggingface_hub"} <= core
    assert not any(r.startswith("torch==") for r in project["dependencies"])  # a range
    extras = project["optional-dependencies"]
    assert "gguf" in _names(extras["gguf"]) and {"gguf", "datasets"} <= _names(extras["all"])
    assert project["dynamic"] == ["version"] and PYPROJECT["tool"]["setuptools"]["dynamic"][
        "version"] == {"attr": "dpgrpo.__version__"}
    setup = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    assert '".[all,dev]" "torch==2.13.0"' in setup  # CI keeps the exact pin and the GGUF extra


def test_missing_gguf_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from dpgrpo.model import load_base_model, load_tokenizer

    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    monkeypatch.setenv("DPGRPO_CACHE", "off")
    for load in (load_base_model, load_tokenizer):
        with pytest.raises(ConfigError, match=r"pip install 'dpgrpo\[gguf\]'"):
            load(str(fake))


def test_top_level_api_is_lazy_and_documented():
    import subprocess
    import sys

    code = ("import sys, dpgrpo; from dpgrpo import RunConfig, load_config; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    for name in ("train", "evaluate", "make_task", "TrainResult", "Problem", "RunConfig",
                 "load_config", "push_release"):
        assert getattr(dpgrpo, name).__doc__, name
    assert set(dpgrpo.__all__) >= {"train", "evaluate", "RunConfig", "TrainResult"}
