"""Opt-in training metrics of public quantities only (``train.metrics``; invariant 6).

A row per round holds the round, T and epsilon spent so far (the progress bar's certified
upper bound). Nothing computed from the data enters a row: :data:`PUBLIC_KEYS` is an
allow-list and any other key raises :class:`~dpgrpo.errors.PrivacyError`. Batch sizes,
rewards and lengths stay in ``recovery/telemetry.jsonl``.

Wall-clock times are private by default. Each round's times per phase of Algorithm 1
(``rollout``: G completions and their rewards; ``reference``: the frozen base's log-probs for
the KL term; ``gradients``, ``mechanism``, ``step``), the round's total and the elapsed time
(whose differences are the round times) grow with the realized batch size: on a quiet machine
``time/reference`` correlates +0.996 with it and a least-squares line recovers it exactly in
59 of 60 rounds (issue 32). They go to ``recovery/telemetry.jsonl`` with the round's other
private values. ``train.public_timings = true`` (:data:`TIMING_KEYS`) also writes them to the
metrics rows, an explicit opt-in to a side channel the guarantee on the weights does not
cover; a releasable run refuses to send them off the machine (``wandb``).

Backends (several may be combined, ``train.metrics = ["jsonl", "tensorboard"]``):

* ``jsonl``: ``RUN_DIR/metrics.jsonl``, one JSON object per round;
* ``tensorboard``: event files in ``RUN_DIR/tensorboard/`` (needs ``tensorboard``:
  ``pip install 'dpgrpo[metrics]'``);
* ``wandb``: Weights & Biases, if ``wandb`` is installed and logged in (off the machine).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from dpgrpo.config.schema import OFF_MACHINE, MetricsBackend, check_timing_sinks
from dpgrpo.config.values import choices
from dpgrpo.errors import ConfigError, PrivacyError

PHASES = ("rollout", "reference", "gradients", "mechanism", "step")
BACKENDS: tuple[str, ...] = choices(MetricsBackend)   # the config's one list of them
#: The only keys a metrics row may hold by default: public values (invariant 6).
PUBLIC_KEYS = frozenset({"round", "rounds", "epsilon"})
#: Wall-clock keys: they reveal the realized batch size, so only with train.public_timings.
TIMING_KEYS = frozenset({"elapsed", "time/round", *(f"time/{phase}" for phase in PHASES)})
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

    def __init__(self, run_dir: Path, config: Mapping[str, object]) -> None:
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
    """Writes public rows to every sink; refuses any key outside :data:`PUBLIC_KEYS` (and
    :data:`TIMING_KEYS` when ``timings``, the train.public_timings opt-in)."""

    def __init__(self, sinks: list[Sink], *, timings: bool = False) -> None:
        self.sinks = sinks
        self.timings = timings
        self.allowed = PUBLIC_KEYS | TIMING_KEYS if timings else PUBLIC_KEYS

    def log(self, row: Mapping[str, float]) -> None:
        private = sorted(set(row) - self.allowed)
        if private:
            why = (" (wall-clock times reveal the realized batch size; they are logged only "
                   "with train.public_timings = true)" if set(private) & TIMING_KEYS else "")
            raise PrivacyError(f"metrics may hold public values only; refusing {private}{why} "
                               "(private telemetry goes to recovery/telemetry.jsonl)")
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_metrics(backends: tuple[str, ...], run_dir: Path,
                 public_config: Mapping[str, object] | None = None, *, timings: bool = False,
                 releasable: bool = True) -> MetricsLogger | None:
    """The logger for ``train.metrics`` (None when empty); ``public_config`` goes to W&B.
    ``timings`` (train.public_timings) admits :data:`TIMING_KEYS`; see the module docstring."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ConfigError(f"train.metrics: unknown backend(s) {unknown}; known: {list(BACKENDS)}")
    check_timing_sinks(backends, timings, releasable)
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
    return MetricsLogger(sinks, timings=timings)


__all__ = [
    "BACKENDS",
    "METRICS_FILE",
    "OFF_MACHINE",
    "PHASES",
    "PUBLIC_KEYS",
    "TENSORBOARD_DIR",
    "TIMING_KEYS",
    "Laps",
    "MetricsLogger",
    "check_timing_sinks",
    "open_metrics",
]
