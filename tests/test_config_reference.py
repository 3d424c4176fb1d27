"""docs/config.md is generated from the config dataclasses and must be current (issue 28)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dpgrpo.config import AuditConfig, DataConfig, ModelConfig, PrivacyConfig, TrainConfig
from dpgrpo.config.reference import fields, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"
CLASSES = {"model": ModelConfig, "data": DataConfig, "privacy": PrivacyConfig,
           "train": TrainConfig, "audit": AuditConfig}


def test_the_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/config.md is stale: python -m dpgrpo.config.reference > docs/config.md")


def test_every_key_is_on_the_page_with_its_default_and_what_it_does():
    found = fields()
    for section, cls in CLASSES.items():
        rows = {key: (default, what) for key, default, what in found[section]}
        assert list(rows) == [f.name for f in dataclasses.fields(cls)], section
        for f in dataclasses.fields(cls):
            default, what = rows[f.name]
            assert what, f"{section}.{f.name} has no comment in config/schema.py"
            assert eval(default) == f.default, f"{section}.{f.name}"  # noqa: S307 (our source)


def test_a_stale_page_or_an_undocumented_key_is_caught():
    source = "class ModelConfig:\n    name: str = 'x'\n    undocumented: int = 1\n"
    for cls in ("DataConfig", "PrivacyConfig", "TrainConfig", "AuditConfig"):
        source += f"class {cls}:\n    pass\n"
    rows = fields(source)["model"]
    assert rows == [("name", "'x'", ""), ("undocumented", "1", "")]
    assert "| `model.undocumented` | `1` | - |" in render(source)
