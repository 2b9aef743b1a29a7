"""Experiment tracking: one ``Tracking`` object fans metrics out to the chosen backends.

Backends (``trainer.logger``): ``console`` (one compact line per step), ``jsonl`` (a
``metrics.jsonl`` file in the run directory, one JSON object per step — the source for plots
and for comparing runs), ``tensorboard`` and ``wandb`` (optional dependencies; wandb runs in
offline mode unless the user configured it otherwise).

The run's config goes to the backends that record one (W&B) with its secrets redacted
(:func:`hybridflow.config.secrets.redact`): API keys and tokens never reach a tracker.

Resume: :meth:`Tracking.rewind` is called with the first step the resumed process will log,
and each backend drops what it holds at or past that step — rows logged after the checkpoint
by a run that crashed — so the resumed run's rows replace them instead of following them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hybridflow.config.secrets import redact
from hybridflow.engine.checkpoint import atomic_write_text

# The few metrics the console line shows, in this order, with short labels.
CONSOLE_KEYS: tuple[tuple[str, str], ...] = (
    ("critic/score/mean", "score"),
    ("val-core/mean", "val"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/ppo_kl", "kl"),
    ("actor/entropy", "ent"),
    ("actor/kl_loss", "kl_loss"),
    ("response_length/mean", "resp_len"),
    ("timing_s/step", "step_s"),
    ("train/loss", "loss"),  # SFT
    ("val/loss", "val_loss"),  # SFT
)


class Backend(Protocol):
    def log(self, data: Mapping[str, float], step: int) -> None: ...

    def rewind(self, next_step: int) -> None: ...

    def finish(self) -> None: ...


def _to_float(value: Any) -> float | None:
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except (TypeError, ValueError):
        return None


class ConsoleBackend:
    """Prints ``step 3 | score 0.250 | pg_loss -0.012 | ...`` (validation keys when present)."""

    def __init__(self, print_fn=print) -> None:
        self._print = print_fn

    def log(self, data: Mapping[str, float], step: int) -> None:
        parts = [f"step {step}"]
        for key, label in CONSOLE_KEYS:
            if key in data:
                parts.append(f"{label} {data[key]:.4g}")
        parts += [f"{k} {v:.4g}" for k, v in data.items() if k.startswith("val-core/") and k.endswith("/mean@1")]
        self._print(" | ".join(parts))

    def rewind(self, next_step: int) -> None:
        pass  # printed lines cannot be taken back

    def finish(self) -> None:
        pass


class JsonlBackend:
    """Appends ``{"step": N, **metrics}`` to ``<run_dir>/metrics.jsonl``, flushed and fsynced
    every step (the trainer logs a step before committing its checkpoint)."""

    DROPPED_FILE = "metrics.dropped.jsonl"

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, data: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: (None if math.isnan(v) else v) for k, v in data.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def rewind(self, next_step: int) -> None:
        """Keep the rows of steps before ``next_step``; the others (and a line cut short by a
        crash) move to ``metrics.dropped.jsonl``, so nothing is lost."""
        self._file.close()
        kept: list[str] = []
        dropped: list[str] = []
        for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.strip():
                continue
            try:
                step = json.loads(line)["step"]
                keep = isinstance(step, (int, float)) and step < next_step
            except (ValueError, KeyError, TypeError):
                keep = False
            (kept if keep else dropped).append(line if line.endswith("\n") else line + "\n")
        if dropped:
            with (self.path.parent / self.DROPPED_FILE).open("a", encoding="utf-8") as f:
                f.writelines(dropped)
            atomic_write_text(self.path, "".join(kept))
            print(
                f"{self.path}: {len(dropped)} row(s) from step {next_step} on, logged after the checkpoint "
                f"resumed from, moved to {self.DROPPED_FILE}"
            )
        self._file = self.path.open("a", encoding="utf-8")

    def finish(self) -> None:
        self._file.close()


class TensorboardBackend:
    def __init__(self, run_dir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "trainer.logger includes 'tensorboard' but tensorboard is not installed: "
                "pip install 'hybridflow[tensorboard]'"
            ) from e
        self._summary_writer = SummaryWriter
        self._log_dir = str(Path(run_dir) / "tensorboard")
        self._writer = SummaryWriter(log_dir=self._log_dir)

    def log(self, data: Mapping[str, float], step: int) -> None:
        for key, value in data.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def rewind(self, next_step: int) -> None:
        """A new event file that starts with a purge marker: TensorBoard discards the events of
        earlier files at or past ``next_step``."""
        self._writer.close()
        self._writer = self._summary_writer(log_dir=self._log_dir, purge_step=next_step)

    def finish(self) -> None:
        self._writer.close()


class WandbBackend:
    def __init__(self, project: str, experiment: str, run_dir: str | os.PathLike, config: dict) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError("trainer.logger includes 'wandb' but wandb is not installed: pip install wandb") from e
        os.environ.setdefault("WANDB_MODE", "offline")
        self._run = wandb.init(project=project, name=experiment, dir=str(run_dir), config=redact(config))

    def log(self, data: Mapping[str, float], step: int) -> None:
        self._run.log(dict(data), step=step)

    def rewind(self, next_step: int) -> None:
        """W&B history is append-only: each process logs to its own W&B run, so the resumed
        run holds no row twice; the crashed process's run keeps its rows. Recorded here."""
        self._run.config.update({"resumed_at_step": next_step}, allow_val_change=True)

    def finish(self) -> None:
        self._run.finish()


BACKENDS = ("console", "jsonl", "tensorboard", "wandb")


class Tracking:
    """Fans ``log(metrics, step)`` out to every selected backend; non-numeric values are dropped."""

    def __init__(
        self,
        backends: list[str],
        run_dir: str | os.PathLike,
        project_name: str = "hybridflow",
        experiment_name: str = "run",
        config: dict | None = None,
        print_fn=print,
    ) -> None:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; valid: {list(BACKENDS)}")
        self.config: dict[str, Any] = redact(config or {})  # what any backend may record of the run
        self.backends: dict[str, Backend] = {}
        for name in backends:
            if name == "console":
                self.backends[name] = ConsoleBackend(print_fn)
            elif name == "jsonl":
                self.backends[name] = JsonlBackend(run_dir)
            elif name == "tensorboard":
                self.backends[name] = TensorboardBackend(run_dir)
            elif name == "wandb":
                self.backends[name] = WandbBackend(project_name, experiment_name, run_dir, self.config)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        clean = {k: f for k, v in data.items() if (f := _to_float(v)) is not None}
        for backend in self.backends.values():
            backend.log(clean, step)

    def rewind(self, next_step: int) -> None:
        """Drop, in every backend, what was logged at or past ``next_step`` (see the module doc)."""
        for backend in self.backends.values():
            backend.rewind(next_step)

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()


def read_jsonl_metrics(path: str | os.PathLike) -> list[dict[str, float]]:
    """Rows of a ``metrics.jsonl`` file (a run directory or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no metrics file at {path} (run with trainer.logger including 'jsonl')")
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append({k: (np.nan if v is None else v) for k, v in json.loads(line).items()})
    return rows
