"""One ``hybridflow train`` run in this process, optionally killing a rank, for the scale-out tests.

    python -m tests.scale.ppo_run --result-file F [--kill-rank R --at-step S] KEY=VALUE ...

Run from the repository root in a subprocess (the test does): the run starts its own local Ray
instance and everything it started ends with the process. ``--kill-rank R --at-step S`` sends
SIGKILL to rank R's process just before training step S, as a crash would. Writes a JSON
object to ``--result-file`` (not stdout: Ray's log monitor writes the workers' output there
from another thread, and a line of ours could be merged into one of theirs): the ranks' nodes
and pids, whether ``fit()`` finished, else the error's type, rank, method and message.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from hybridflow.config import load_config
from hybridflow.controller import WorkerError
from hybridflow.entrypoints.train import build_trainer


def main(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-file", required=True)
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--at-step", type=int, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    trainer = build_trainer(load_config(None, args.overrides))
    hosts = trainer.workers.actor.host_infos()
    result: dict[str, object] = {"nodes": [h.node_ip for h in hosts], "pids": [h.pid for h in hosts]}
    if args.kill_rank is not None:
        real_step = trainer.step

        def step_with_crash(prompts=None):  # test-only: the crash happens at a known point of the run
            if trainer.global_steps == args.at_step:
                os.kill(hosts[args.kill_rank].pid, signal.SIGKILL)
            return real_step(prompts)

        trainer.step = step_with_crash
    try:
        trainer.fit()
        result["finished"] = True
    except WorkerError as err:
        result.update(finished=False, error=type(err).__name__, rank=err.rank, method=err.method, message=str(err))
    finally:
        trainer.tracking.finish()
    result["global_steps"] = trainer.global_steps
    with open(args.result_file, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
