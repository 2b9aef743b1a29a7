"""What both sides of the hybridflow-vs-TRL comparison share: settings, data, child processes, stats.

The comparison scripts (``grpo_vs_trl.py``, ``learning_vs_trl.py``) run each side in its own
child process (``_hybridflow_side.py``, ``_trl_side.py``) with one :class:`BenchSettings`
written as JSON. A child writes one JSON result (:func:`write_json`); the parent samples the
child's process-tree RSS while it runs (:func:`run_side`) and compares the two results.

Everything here is importable without torch, so the parent process stays small and its own
memory never blurs the children's.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SIDES: dict[str, Path] = {
    "hybridflow": BENCH_DIR / "_hybridflow_side.py",
    "trl": BENCH_DIR / "_trl_side.py",
}
DTYPES: tuple[str, ...] = ("fp32", "bf16")
# Phases timed on both sides (seconds per step); the rest of a step is the update (forward +
# backward + optimizer) plus advantages and bookkeeping.
PHASES: tuple[str, ...] = ("gen", "reward", "old_log_prob", "ref")
MIB = 1024 * 1024


@dataclass(frozen=True)
class BenchSettings:
    """One job, identical on both sides. Sizes count prompts or responses as named.

    ``micro_batch`` is the number of responses per forward/backward pass (and per reference
    log-prob pass); ``prompts_per_step × samples_per_prompt`` responses make one optimizer
    step. ``dtype`` is the resolved compute dtype (the parent resolves ``auto`` once, see
    :func:`hardware_facts`); ``attn_implementation`` is the kernel hybridflow picks, given to
    both sides. ``equal_work``: every response is exactly ``max_new_tokens`` long on both sides
    (hybridflow ``rollout.ignore_eos``, TRL ``min_new_tokens``), so sampled lengths cannot move
    a ratio. ``budget_s`` switches a side to the learning mode: train until that much training
    time has passed, measuring greedy accuracy on ``test_file`` every ``eval_every_s``
    seconds of training time (evaluation time is not counted).
    """

    model: str
    train_file: str
    run_dir: str
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    lr: float = 1e-6
    weight_decay: float = 0.0
    kl_coef: float = 0.001
    clip_ratio: float = 0.2
    grad_clip: float = 1.0
    micro_batch: int = 8
    dtype: str = "fp32"
    attn_implementation: str = "eager"
    equal_work: bool = False
    seed: int = 1
    threads: int = 1
    warmup_steps: int = 1
    steps: int = 3
    test_file: str | None = None
    budget_s: float | None = None
    eval_every_s: float | None = None
    start_eval: bool = True  # evaluate at 0 s (a later seed of the same model may skip it: greedy, same score)

    def __post_init__(self) -> None:
        positive = ("prompts_per_step", "max_new_tokens", "micro_batch", "threads", "steps")
        bad = [f"{name}={getattr(self, name)}" for name in positive if getattr(self, name) < 1]
        if bad:
            raise ValueError(f"these settings must be at least 1: {', '.join(bad)}")
        if self.samples_per_prompt < 2:
            raise ValueError(
                f"samples_per_prompt must be at least 2 (GRPO compares samples), got {self.samples_per_prompt}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.rows_per_step % self.micro_batch:
            raise ValueError(
                f"micro_batch={self.micro_batch} must divide the {self.rows_per_step} responses of a step "
                f"(prompts_per_step × samples_per_prompt)"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if (self.budget_s is None) != (self.eval_every_s is None) or (
            self.budget_s is not None and self.test_file is None
        ):
            raise ValueError("the learning mode needs budget_s, eval_every_s and test_file together")

    @property
    def rows_per_step(self) -> int:
        """Responses per optimizer step: prompts × samples."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def micro_steps(self) -> int:
        """Forward/backward passes (gradient-accumulation steps) per optimizer step."""
        return self.rows_per_step // self.micro_batch

    @property
    def total_steps(self) -> int:
        """Warm-up plus timed steps (the speed mode's step count)."""
        return self.warmup_steps + self.steps

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(path, asdict(self))

    @classmethod
    def load(cls, path: str | os.PathLike) -> BenchSettings:
        raw = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown settings {unknown}")
        return cls(**raw)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (parents created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    return out


def write_task(
    out_dir: Path, task: str, train_size: int, test_size: int, seed: int = 0, extra_args: list[str] | None = None
) -> Path:
    """A built-in task (``hybridflow data TASK``) in ``out_dir``; returns the folder."""
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing
    from hybridflow.entrypoints.data import main as data_main

    argv = [
        task,
        "--out",
        str(out_dir),
        "--train-size",
        str(train_size),
        "--test-size",
        str(test_size),
        "--seed",
        str(seed),
        *(extra_args or []),
    ]
    if data_main(argv) != 0:
        raise RuntimeError(f"hybridflow data {' '.join(argv)} failed")
    return out_dir


def write_arithmetic_task(out_dir: Path, train_size: int, test_size: int, seed: int = 0, digits: int = 2) -> Path:
    """The built-in arithmetic task (``hybridflow data arithmetic``) in ``out_dir``; returns the folder."""
    return write_task(out_dir, "arithmetic", train_size, test_size, seed, ["--digits", str(digits)])


# ---------------------------------------------------------------------------------- children
def private_bytes(pid: int) -> int:
    """Memory only ``pid`` holds (``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``).

    For a forked helper process this leaves out the pages it still shares with its parent,
    which its RSS would count a second time.
    """
    total_kib = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total_kib += int(line.split()[1])
    return total_kib * 1024


class TreeMemorySampler:
    """Peak memory of a process tree, sampled every ``interval_s``: the root's RSS plus each
    descendant's private memory (:func:`private_bytes`), and the root's RSS alone."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_tree_bytes = 0
        self.peak_root_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                root_rss = root.memory_info().rss
                helpers = root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            extra = 0
            for proc in helpers:
                try:
                    extra += private_bytes(proc.pid)
                except OSError:
                    continue  # a short-lived helper ended between listing and reading
            self.peak_root_bytes = max(self.peak_root_bytes, root_rss)
            self.peak_tree_bytes = max(self.peak_tree_bytes, root_rss + extra)
            self._stop.wait(self.interval_s)


def child_env(threads: int) -> dict[str, str]:
    """The environment of a side's process: offline, ``threads`` intra-op threads, quiet tokenizers."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    return env


def run_side(side: str, settings: BenchSettings, timeout_s: float | None = None, echo: bool = True) -> dict[str, Any]:
    """Run one side's child process on ``settings``; returns its JSON result plus parent-side facts.

    Added keys: ``peak_mem_tree_mb`` (the child's RSS plus its helper processes' private
    memory, sampled), ``peak_rss_sampled_mb`` (the child's RSS, sampled), ``wall_s``,
    ``load_before`` / ``load_after`` (1-minute load average), ``log`` (the child's output file).
    """
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r}; valid: {', '.join(SIDES)}")
    run_dir = Path(settings.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings_path = settings.save(run_dir / "settings.json")
    out_path, log_path = run_dir / "result.json", run_dir / "log.txt"
    out_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(SIDES[side]), "--settings", str(settings_path), "--out", str(out_path)]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(settings.threads))
        with TreeMemorySampler(proc.pid) as sampler:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{side} side ran past {timeout_s} s; its log: {log_path}") from None
    wall = time.perf_counter() - start
    if rc != 0 or not out_path.is_file():
        raise RuntimeError(f"{side} side failed (exit code {rc}); last lines of {log_path}:\n{tail(log_path, 40)}")
    result = json.loads(out_path.read_text())
    result.update(
        peak_mem_tree_mb=sampler.peak_tree_bytes / MIB,
        peak_rss_sampled_mb=sampler.peak_root_bytes / MIB,
        wall_s=wall,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        log=str(log_path),
    )
    if echo:
        print(f"  {side}: done in {wall:.0f} s (log: {log_path})")
    return result


def tail(path: Path, lines: int) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join(text[-lines:])


def peak_rss_self_mb() -> tuple[float, float]:
    """``(this process, its waited-for children)`` peak RSS in MiB (``getrusage``; Linux counts KiB)."""
    import resource

    return (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    )


# ---------------------------------------------------------------------------------- statistics
def summarize_steps(result: dict[str, Any]) -> dict[str, float]:
    """Median / min / max step time and rollout tokens/s over the timed (post-warm-up) steps.

    Rollout tokens/s = Σ generated response tokens / Σ generation seconds over those steps.
    ``median_{phase}_s`` for each of :data:`PHASES` (0 when a side skips it) and
    ``median_rest_s`` = step time minus those phases.
    """
    timed = result["steps"][result["warmup_steps"] :]
    if not timed:
        raise ValueError(f"{result['side']}: no timed steps after {result['warmup_steps']} warm-up step(s)")
    times = [s["step_s"] for s in timed]
    gen_s = sum(s["gen_s"] for s in timed)
    tokens = sum(s["gen_tokens"] for s in timed)
    return {
        "timed_steps": float(len(timed)),
        "median_step_s": statistics.median(times),
        "min_step_s": min(times),
        "max_step_s": max(times),
        "median_gen_s": statistics.median(s["gen_s"] for s in timed),
        "rollout_tokens_per_s": tokens / gen_s if gen_s > 0 else float("nan"),
        "mean_response_tokens": tokens / (result["rows_per_step"] * len(timed)),
        "mean_score": statistics.fmean(s["score_mean"] for s in timed),
        **{f"median_{name}_s": statistics.median(s["phases"].get(name, 0.0) for s in timed) for name in PHASES},
        "median_rest_s": statistics.median(s["step_s"] - sum(s["phases"].get(n, 0.0) for n in PHASES) for s in timed),
    }


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def compare(hybridflow: dict[str, Any], trl: dict[str, Any]) -> dict[str, float]:
    """The TRL / hybridflow ratios of step time, rollout tokens/s, peak RSS of the main process
    (``getrusage``) and peak memory of the process tree (main RSS + helpers' private memory).

    Step time and RSS: > 1 means hybridflow is faster / smaller. Tokens/s: < 1 means
    hybridflow generates faster.
    """
    hf, tr = summarize_steps(hybridflow), summarize_steps(trl)
    return {
        "step_time_trl_over_hybridflow": ratio(tr["median_step_s"], hf["median_step_s"]),
        "rollout_tokens_per_s_trl_over_hybridflow": ratio(tr["rollout_tokens_per_s"], hf["rollout_tokens_per_s"]),
        "peak_rss_trl_over_hybridflow": ratio(trl["peak_rss_self_mb"], hybridflow["peak_rss_self_mb"]),
        "peak_mem_tree_trl_over_hybridflow": ratio(trl["peak_mem_tree_mb"], hybridflow["peak_mem_tree_mb"]),
    }


# Environment variables that cap the instruction set torch / oneDNN / MKL use: set, they make
# a CPU with native bf16 behave like an AVX2-only one (how the slow kind is emulated).
ISA_CAPS: tuple[str, ...] = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def machine_facts() -> dict[str, Any]:
    """CPU model and flags, cores, load, ISA caps in effect and package versions (read from
    /proc and metadata: nothing heavy is imported)."""
    sys.path.insert(0, str(REPO_ROOT))
    from hybridflow.utils.cpu import cpu_flags, cpu_model, reported_flags

    versions = {}
    for name in ("torch", "transformers", "trl", "accelerate"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu_model(),
        "cpu_flags": reported_flags(cpu_flags()),
        "cores": os.cpu_count(),
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if k in os.environ},
        "loadavg": list(os.getloadavg()),
        "python": sys.version.split()[0],
        **versions,
    }


_HARDWARE_SNIPPET = """
import json, sys, torch
from hybridflow.models.attention import choose_attn_implementation
from hybridflow.utils.precision import describe_compute_dtype
torch.set_num_threads(int(sys.argv[3]))
auto, chosen = describe_compute_dtype("auto"), describe_compute_dtype(sys.argv[1])
print(json.dumps({"dtype": chosen.dtype, "dtype_requested": sys.argv[1], "auto_decision": auto.line(),
                  "dtype_warning": chosen.warning, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "attn_implementation": choose_attn_implementation("auto", "cpu", int(sys.argv[2]))}))
"""


def hardware_facts(dtype: str, max_tokens: int, threads: int) -> dict[str, Any]:
    """What hybridflow decides on this machine, asked in a child process (torch stays out of the
    parent): the compute dtype for ``dtype`` (``auto`` resolved by the probe), the line the
    auto rule prints, torch's CPU capability and the attention kernel for rows of ``max_tokens``."""
    out = subprocess.run(
        [sys.executable, "-c", _HARDWARE_SNIPPET, dtype, str(max_tokens), str(threads)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env=child_env(threads),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_kind(machine: dict[str, Any], hardware: dict[str, Any]) -> str:
    """Short name of the CPU kind for titles: native bf16 or not, and whether the ISA was capped."""
    native = hardware["auto_decision"].startswith("compute dtype: bf16")
    caps = " (ISA capped to emulate it)" if machine.get("isa_caps") else ""
    return ("native-bf16 CPU" if native else "CPU without native bf16") + caps


def describe_machine(machine: dict[str, Any], hardware: dict[str, Any], threads: int) -> list[str]:
    """Header lines of a report: the CPU, its flags, the caps in effect and the dtype decision."""
    caps = ", ".join(f"{k}={v}" for k, v in machine.get("isa_caps", {}).items())
    return [
        f"CPU: {machine['cpu']} ({machine['cores']} cores; flags: {' '.join(machine['cpu_flags']) or 'none of note'}; "
        f"torch CPU capability {hardware['torch_cpu_capability']}{'; ISA capped: ' + caps if caps else ''}), "
        f"{threads} torch threads",
        f"{hardware['auto_decision']}; this run: {hardware['dtype']}"
        + (f" (requested {hardware['dtype_requested']})" if hardware["dtype_requested"] != "auto" else " (auto)"),
    ]


# ---------------------------------------------------------------------------------- report
def format_speed_report(settings: BenchSettings, hybridflow: dict[str, Any], trl: dict[str, Any]) -> str:
    """The table printed by ``grpo_vs_trl.py``: one row per quantity, both sides and the ratio."""
    hf, tr = summarize_steps(hybridflow), summarize_steps(trl)
    ratios = compare(hybridflow, trl)
    rows = [
        ("median step time (s)", hf["median_step_s"], tr["median_step_s"], ratios["step_time_trl_over_hybridflow"]),
        (
            "  min / max step (s)",
            f"{hf['min_step_s']:.2f} / {hf['max_step_s']:.2f}",
            f"{tr['min_step_s']:.2f} / {tr['max_step_s']:.2f}",
            "",
        ),
        (
            "median rollout time (s)",
            hf["median_gen_s"],
            tr["median_gen_s"],
            ratio(tr["median_gen_s"], hf["median_gen_s"]),
        ),
        (
            "rollout tokens/s",
            hf["rollout_tokens_per_s"],
            tr["rollout_tokens_per_s"],
            ratios["rollout_tokens_per_s_trl_over_hybridflow"],
        ),
        *[
            (
                f"  median {name} phase (s)",
                hf[f"median_{name}_s"],
                tr[f"median_{name}_s"],
                ratio(tr[f"median_{name}_s"], hf[f"median_{name}_s"]),
            )
            for name in PHASES
            if name != "gen"
        ],
        (
            "  median rest: update etc. (s)",
            hf["median_rest_s"],
            tr["median_rest_s"],
            ratio(tr["median_rest_s"], hf["median_rest_s"]),
        ),
        ("mean response tokens", hf["mean_response_tokens"], tr["mean_response_tokens"], ""),
        ("mean reward (timed steps)", hf["mean_score"], tr["mean_score"], ""),
        (
            "peak RSS, main process (MiB)",
            hybridflow["peak_rss_self_mb"],
            trl["peak_rss_self_mb"],
            ratios["peak_rss_trl_over_hybridflow"],
        ),
        (
            "peak memory, process tree (MiB)",
            hybridflow["peak_mem_tree_mb"],
            trl["peak_mem_tree_mb"],
            ratios["peak_mem_tree_trl_over_hybridflow"],
        ),
        ("setup before step 1 (s)", hybridflow["setup_s"], trl["setup_s"], ""),
        (
            "1-min load before / after",
            f"{hybridflow['load_before']:.1f} / {hybridflow['load_after']:.1f}",
            f"{trl['load_before']:.1f} / {trl['load_after']:.1f}",
            "",
        ),
    ]
    lines = [
        f"GRPO step, {settings.prompts_per_step} prompts × {settings.samples_per_prompt} samples, "
        + (f"exactly {settings.max_new_tokens}" if settings.equal_work else f"≤ {settings.max_new_tokens}")
        + f" new tokens, {settings.dtype}, attention {settings.attn_implementation}, {settings.threads} threads, "
        f"{settings.steps} timed step(s) after {settings.warmup_steps} warm-up",
        f"{'':30} {'hybridflow':>14} {'TRL':>14} {'TRL/hybridflow':>15}",
    ]
    for name, a, b, r in rows:
        lines.append(f"{name:30} {_cell(a):>14} {_cell(b):>14} {_cell(r):>15}")
    lines.append("peak RSS: getrusage of each side's process; process tree: its RSS plus the private memory of")
    lines.append("its helper processes (hybridflow's kept reward worker), sampled every 0.2 s")
    lines.append("work each side does per step (measured where marked):")
    lines += [f"  hybridflow: {w}" for w in hybridflow["work"]]
    lines += [f"  TRL:        {w}" for w in trl["work"]]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


# ---------------------------------------------------------------------------------- learning mode
@dataclass
class LearningClock:
    """Training-time bookkeeping of the learning mode (evaluation time is never added).

    Evaluate at 0 s (unless ``start_eval`` is false), then each time another ``eval_every_s``
    seconds of training passed; stop once ``budget_s`` seconds of training passed.
    """

    budget_s: float
    eval_every_s: float
    start_eval: bool = True
    train_s: float = 0.0
    next_eval_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.start_eval:
            self.next_eval_s = self.eval_every_s

    def add(self, step_s: float) -> None:
        self.train_s += step_s

    def eval_due(self) -> bool:
        return self.train_s >= self.next_eval_s

    def mark_evaluated(self) -> None:
        while self.next_eval_s <= self.train_s:
            self.next_eval_s += self.eval_every_s

    def done(self) -> bool:
        return self.train_s >= self.budget_s


def side_main(run: Callable[[BenchSettings], dict[str, Any]], doc: str | None, argv: list[str] | None = None) -> int:
    """Command line of a side process: ``--settings`` (BenchSettings JSON) in, ``--out`` (result JSON) out."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", required=True, help="BenchSettings JSON")
    parser.add_argument("--out", required=True, help="result JSON to write")
    args = parser.parse_args(argv)
    write_json(args.out, run(BenchSettings.load(args.settings)))
    return 0


# ---------------------------------------------------------------------------- CLI pipelines
# The CLI through the running interpreter: the ``hybridflow`` script need not be on PATH (a
# virtualenv that is not activated), and the command runs the same Python as its caller.
HYBRIDFLOW = [sys.executable, "-m", "hybridflow.cli"]


def main_job_task(work: Path, env: dict[str, str]) -> Path:
    """The main job's arithmetic task (same generator and defaults) in ``work/task``, written once."""
    task = work / "task"
    if not (task / "train.parquet").exists():
        run_logged([*HYBRIDFLOW, "data", "arithmetic", "--out", str(task)], work / "data.log", env)
    return task


def run_logged(cmd: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> float:
    """Run one CLI command of a pipeline benchmark (in ``cwd``) with its output in ``log``; its
    wall time, or RuntimeError with the log's tail."""
    print(f"$ {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        raise RuntimeError(f"exit code {rc} after {wall:.0f} s; last lines of {log}:\n{tail(log, 30)}")
    print(f"  done in {wall:.0f} s (log: {log})", flush=True)
    return wall


def follow_metrics(path: Path, start: float, done: threading.Event, stamped: list[dict[str, Any]]) -> None:
    """Append each new line of ``path`` to ``stamped`` with ``wall_s`` = seconds since ``start``.

    Run in a thread beside a training child: the trainer's metrics lines carry no clock, so
    the wall time a curve is drawn against is taken here, when the line appears. Polls until
    ``done`` is set, then reads once more so the last lines are not lost.
    """
    seen = 0
    while True:
        finished = done.is_set()
        if path.exists():
            lines = path.read_text().splitlines()
            for line in lines[seen:]:
                if line.strip():
                    stamped.append({**json.loads(line), "wall_s": time.perf_counter() - start})
            seen = len(lines)
        if finished:
            return
        time.sleep(0.5)


def plot_unit_curves(
    png: Path, title: str, xlabel: str, curves: list[tuple[list, list, dict]], legend_loc: str
) -> None:
    """One PNG of curves on a 0..1 axis: ``curves`` are (xs, ys, matplotlib plot kwargs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for xs, ys, style in curves:
        ax.plot(xs, ys, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
