"""The ``hybridflow`` console command: one subcommand per entry point.

Each subcommand forwards the rest of the command line to the entry point's own ``main``
(``hybridflow.entrypoints.<module>``), so ``hybridflow train a.b=c`` is exactly
``python -m hybridflow.entrypoints.train a.b=c``.
"""

from __future__ import annotations

import importlib
import os
import sys

from hybridflow.utils.errors import DEBUG_ENV

# subcommand -> (entry point module with a ``main(argv)`` function, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hybridflow.entrypoints.train", "RL post-training (PPO, GRPO, ...) with verl-style overrides"),
    "sft": ("hybridflow.entrypoints.sft", "supervised fine-tuning on prompt/response or multi-turn chat data"),
    "rm": ("hybridflow.entrypoints.rm", "train a Bradley–Terry reward model on prompt/chosen/rejected pairs"),
    "data": ("hybridflow.entrypoints.data", "write a built-in task's train/test files"),
    "config": ("hybridflow.entrypoints.config", "print the fully resolved config for a set of overrides"),
    "plot": ("hybridflow.entrypoints.plot", "draw a run directory's curves into a PNG"),
    "view": ("hybridflow.entrypoints.view", "local web page of runs: curves, rollouts, timings (live; --export)"),
    "eval": (
        "hybridflow.entrypoints.eval",
        "score a file of generated responses: mean@N, best@N, maj@N per data source",
    ),
    "export": (
        "hybridflow.entrypoints.export",
        "checkpoint → Hugging Face folder (merge), or compare with a reference (test)",
    ),
    "generate": (
        "hybridflow.entrypoints.generate",
        "sample N responses per prompt of a parquet/jsonl file (resumable)",
    ),
    "serve": (
        "hybridflow.entrypoints.serve",
        "OpenAI-compatible HTTP server over the built-in sampler (continuous batching)",
    ),
    "sandbox": ("hybridflow.entrypoints.sandbox", "local code-execution sandbox service (Sandbox Fusion's /run_code)"),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = [
        "usage: hybridflow [--debug] COMMAND [ARGS...]",
        "",
        "--debug: show the full traceback of input errors too (= HYBRIDFLOW_DEBUG=1)",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--debug":
        os.environ[DEBUG_ENV[0]] = "1"
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"hybridflow: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    result = module.main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
