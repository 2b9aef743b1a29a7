"""A PNG of a run's curves (reward, validation accuracy, response length, KL, entropy).

Reads the run's ``metrics.jsonl`` (``trainer.logger`` must include ``jsonl``, which the
trainer always adds for this reason). ``hybridflow plot RUN_DIR`` draws any run.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hybridflow.tracking import read_jsonl_metrics

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("train reward", ("critic/score/mean",)),
    ("validation accuracy", ("val-core/",)),
    ("response length", ("response_length/mean",)),
    ("KL", ("actor/ppo_kl", "actor/kl_loss")),
    ("entropy", ("actor/entropy",)),
)


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] == r[key]]
    if not pts:
        return np.array([]), np.array([])
    steps, vals = zip(*pts)
    return np.asarray(steps), np.asarray(vals, dtype=float)


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write ``<run_dir>/curves.png`` (or ``out``) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl_metrics(run_dir)
    out_path = Path(out) if out else Path(run_dir) / "curves.png"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (title, prefixes) in zip(axes, PANELS):
        keys = sorted({k for r in rows for k in r if any(k.startswith(p) for p in prefixes)})
        keys = [k for k in keys if not k.startswith("val-core/") or "/mean@" in k]
        for key in keys:
            steps, vals = _series(rows, key)
            if len(steps):
                ax.plot(steps, vals, marker="o" if len(steps) < 30 else None, ms=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if keys:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
