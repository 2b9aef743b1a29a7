"""``hybridflow sft trainer.n_gpus_per_node=N`` without torchrun: the N ranks as Ray actors.

The PPO trainer's worker-group machinery (:mod:`hybridflow.controller.ray_backend`) places one
actor per rank on this machine (one CPU each, plus one GPU each on ``cuda``), names rank 0's
address and a free port as the rendezvous, and writes the rank variables torchrun would set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) into each actor's
environment. Every actor then imports the entry point's module and runs its ``main(argv)``,
exactly as a torchrun process would: the config is read again there (it sees ``WORLD_SIZE``) and the data-parallel
code path is the torchrun one (:mod:`hybridflow.trainer.supervised.ranks`).

A rank that fails (an exception, a non-zero exit status, a dead process) is raised by the worker
group at once as a ``WorkerError`` naming the rank; the other ranks, blocked in a collective
with it, are then killed with the group.
"""

from __future__ import annotations

import importlib
import sys

from hybridflow.controller import ClassWithInitArgs, Dispatch, Worker, WorkerError, register


class RankFailedError(RuntimeError):
    """A rank's ``main`` returned a non-zero exit status (its message was printed above)."""


class SupervisedRankWorker(Worker):
    """One rank: runs ``main(argv)`` of the module ``entry_module`` (e.g. ``hybridflow.entrypoints.sft``)
    in this actor's process, with the rank environment set. The module is named, not passed:
    an entry point run with ``python -m`` is ``__main__``, which Ray could not import by name."""

    def __init__(self, entry_module: str, argv: list[str]) -> None:
        super().__init__()
        self._entry_module = entry_module
        self._argv = list(argv)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train(self) -> int:
        """The entry point's whole run on this rank; raises if it exits with a non-zero status."""
        status = int(importlib.import_module(self._entry_module).main(self._argv))
        if status:
            raise RankFailedError(f"rank {self.rank} exited with status {status} (its message is above)")
        return status


def launch_ranks_on_ray(prog: str, entry_module: str, argv: list[str], processes: int, use_gpu: bool) -> int:
    """Run ``entry_module.main(argv)`` on ``processes`` Ray actors of a private Ray instance on
    this machine. Returns 0 when every rank finished; 1 after printing ``prog: <the first
    failure, naming its rank>`` when one did not."""
    from hybridflow.controller.ray_backend import RayResourcePool, RayWorkerGroup, init_ray

    init_ray(None)
    pool = RayResourcePool([processes], use_gpu=use_gpu)
    group = None
    try:
        group = RayWorkerGroup(pool, ClassWithInitArgs(SupervisedRankWorker, entry_module, argv))
        group.call(SupervisedRankWorker.train)
    except WorkerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if group is not None:
            group.shutdown()  # the other ranks may wait in a collective with the failed one
        pool.remove()
    return 0
