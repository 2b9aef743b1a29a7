"""Two fake Ray nodes on this machine (``ray.cluster_utils.Cluster``), one FSDP rank on each.

Run as ``python -m tests.scale.two_node_cluster MODEL_DIR`` from the repository root (the test
does, in a subprocess: a Ray cluster cannot share the test session's own Ray instance). Prints
one line ``TWO_NODE_RESULT {json}``: the node of each rank and how far the two-rank log-probs
are from one process's.
"""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster

from hybridflow import fields as FK
from hybridflow.config import load_config
from hybridflow.controller import ClassWithInitArgs, create_worker_group
from hybridflow.controller.ray_backend import RayResourcePool, init_ray
from hybridflow.workers.actor import ActorWorker
from tests.conftest import _rollout_batch
from tests.scale.fsdp_workers import ProbeActorWorker


def main(model_dir: str) -> dict[str, object]:
    overrides = [f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.dtype=fp32", "trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
    cfg = load_config(None, overrides)
    batch = _rollout_batch(num_rows=4, seed=2)
    single = ActorWorker(load_config(None, overrides[:2]).actor_rollout_ref, share_name=None)  # torch engine
    single.init_model()
    expected = single.compute_log_prob(batch).batch[FK.OLD_LOG_PROBS]

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)  # each node fits one 1-CPU rank: the two ranks must use both
    cluster.wait_for_nodes()
    init_ray(cluster.address)
    pool = RayResourcePool([1, 1], cpus_per_process=1)
    try:
        group = create_worker_group("ray", pool, ClassWithInitArgs(ProbeActorWorker, cfg.actor_rollout_ref, share_name=None))
        group.init_model()
        facts = group.engine_facts()
        got = group.compute_log_prob(batch).batch[FK.OLD_LOG_PROBS]
        group.shutdown()
        return {
            "cluster_nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
            "rank_nodes": [f["node_id"] for f in facts],
            "engines": [f["engine"] for f in facts],
            "world_sizes": [f["world_size"] for f in facts],
            "max_abs_diff": float((got - expected).abs().max()),
        }
    finally:
        pool.remove()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print("TWO_NODE_RESULT", json.dumps(main(sys.argv[1])))  # marked: Ray also logs to stdout
