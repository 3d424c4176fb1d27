"""Opt-in training metrics of public quantities only (``train.metrics``; invariant 6).

A row per round holds the round, T, epsilon spent so far (the progress bar's certified upper
bound), elapsed seconds and wall-clock seconds per phase of Algorithm 1: ``rollout`` (G
completions and their rewards), ``reference`` (the frozen base's log-probs for the KL term),
``gradients`` (per-prompt gradients), ``mechanism`` (clip, sum, noise) and ``step`` (AdamW).
Nothing computed from the data enters a row: :data:`PUBLIC_KEYS` is an allow-list and any other
key raises :class:`~dpgrpo.errors.PrivacyError`. Batch sizes, rewards and lengths stay in
``recovery/telemetry.jsonl``.

Times are measured, never computed from the data, and are treated as public like the elapsed
time on the progress bar; they do correlate with each round's realized batch size and
completion lengths (a timing side channel the guarantee on the weights does not cover), so
keep metric logs with the curator if that matters.

Backends (several may be combined, ``train.metrics = ["jsonl", "tensorboard"]``):

* ``jsonl``: ``RUN_DIR/metrics.jsonl``, one JSON object per round;
* ``tensorboard``: event files in ``RUN_DIR/tensorboard/`` (needs ``tensorboard``:
  ``pip install 'dpgrpo[metrics]'``);
* ``wandb``: Weights & Biases, if ``wandb`` is installed and logged in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dpgrpo.errors import ConfigError, PrivacyError

PHASES = ("rollout", "reference", "gradients", "mechanism", "step")
BACKENDS = ("jsonl", "tensorboard", "wandb")
#: The only keys a metrics row may hold: public values (invariant 6).
PUBLIC_KEYS = frozenset({"round", "steps", "epsilon", "elapsed", "time/round",
                         *(f"time/{phase}" for phase in PHASES)})
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class Laps:
    """Wall-clock seconds per phase of one round: :meth:`mark` charges the time since the
    previous mark (or :meth:`reset`) to a phase. Only the clock is read, never the data."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def row(self) -> dict[str, float]:
        """``time/<phase>`` for every phase of :data:`PHASES` (0.0 where an arm has none)."""
        return {f"time/{phase}": self.seconds.get(phase, 0.0) for phase in PHASES}


class Sink(Protocol):
    def write(self, row: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per round, appended whole (a resumed run appends; nothing to close)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, row: Mapping[str, float]) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(row)) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars under their keys, with the round as the step (torch.utils.tensorboard)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("train.metrics = 'tensorboard' needs the tensorboard package: "
                              "pip install 'dpgrpo[metrics]'") from None
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, row: Mapping[str, float]) -> None:
        for key, value in row.items():
            if key != "round":
                self._writer.add_scalar(key, value, global_step=int(row["round"]))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Weights & Biases: one ``wandb.log`` per round with the round as the step."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("train.metrics = 'wandb' needs the wandb package: "
                              "pip install wandb") from None
        self._run = wandb.init(project="dpgrpo", name=run_dir.name, dir=str(run_dir),
                               config=dict(config), resume="allow")

    def write(self, row: Mapping[str, float]) -> None:
        self._run.log({k: v for k, v in row.items() if k != "round"}, step=int(row["round"]))

    def close(self) -> None:
        self._run.finish()


class MetricsLogger:
    """Writes public rows to every sink; refuses any key outside :data:`PUBLIC_KEYS`."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def log(self, row: Mapping[str, float]) -> None:
        private = sorted(set(row) - PUBLIC_KEYS)
        if private:
            raise PrivacyError(f"metrics may hold public values only; refusing {private} "
                               "(private telemetry goes to recovery/telemetry.jsonl)")
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_metrics(backends: tuple[str, ...], run_dir: Path,
                 public_config: Mapping[str, Any] | None = None) -> MetricsLogger | None:
    """The logger for ``train.metrics`` (None when empty); ``public_config`` goes to W&B."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ConfigError(f"train.metrics: unknown backend(s) {unknown}; known: {list(BACKENDS)}")
    if not backends:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    sinks: list[Sink] = []
    for backend in dict.fromkeys(backends):
        if backend == "jsonl":
            sinks.append(JsonlSink(run_dir / METRICS_FILE))
        elif backend == "tensorboard":
            sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR))
        else:
            sinks.append(WandbSink(run_dir, public_config or {}))
    return MetricsLogger(sinks)


__all__ = ["BACKENDS", "Laps", "METRICS_FILE", "MetricsLogger", "PHASES", "PUBLIC_KEYS",
           "TENSORBOARD_DIR", "open_metrics"]
