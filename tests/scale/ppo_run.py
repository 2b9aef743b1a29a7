"""One ``hybridflow train`` run in this process, optionally killing a rank, for the scale-out tests.

``train(overrides, kill_rank=R, at_step=S)`` sends SIGKILL to rank R's process just before
training step S, as a crash would. The run joins the Ray instance already started in this
process (the test session's ``ray_session``) and gives its actors and placement groups back when
it ends, crashed or not. Returns the ranks' nodes and pids, whether ``fit()`` finished, else the
error's type, rank, method and message.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from hybridflow.config import load_config
from hybridflow.controller import WorkerError
from hybridflow.entrypoints.train import build_trainer


def train(overrides: list[str], kill_rank: int | None = None, at_step: int | None = None) -> dict[str, Any]:
    """Build and fit the trainer of ``overrides``; the facts the test asserts on."""
    trainer = build_trainer(load_config(None, overrides))
    hosts = trainer.workers.actor.host_infos()
    result: dict[str, Any] = {"nodes": [h.node_ip for h in hosts], "pids": [h.pid for h in hosts]}
    if kill_rank is not None:
        real_step = trainer.step

        def step_with_crash(prompts=None):  # test-only: the crash happens at a known point of the run
            if trainer.global_steps == at_step:
                os.kill(hosts[kill_rank].pid, signal.SIGKILL)
            return real_step(prompts)

        trainer.step = step_with_crash  # type: ignore[method-assign]
    try:
        trainer.fit()
        result["finished"] = True
    except WorkerError as err:
        result.update(finished=False, error=type(err).__name__, rank=err.rank, method=err.method, message=str(err))
    finally:
        try:
            trainer.close()  # the ranks' actors and bundles go back to the shared Ray instance
        except WorkerError:  # close() asks the dead rank to close its rollout too: drop the groups without it
            for group in trainer.workers.owners:
                group.shutdown()
    result["global_steps"] = trainer.global_steps
    return result
