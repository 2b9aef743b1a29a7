"""The rollout worker behind each checkpoint-engine backend: the actor's updated weights reach
the rollout (its samples' log-probs equal the actor's), the global step is stamped as the
weight version, and a server rollout (``backend=http``) generates on ``hybridflow serve``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import ConfigError, load_config
from hybridflow.protocol import DataProto
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.rollout import actor_logprob_diff
from hybridflow.workers.rollout.worker import RolloutWorker
from hybridflow.workers.shared_policy import withdraw_policy
from tests.serving import serve_in_thread

TIMEOUT_S = 120


def _config(tiny_model_dir, *overrides: str):
    return load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.response_length=6",
            "actor_rollout_ref.rollout.temperature=0.8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=0.05",
            *overrides,
        ],
    )


@pytest.fixture
def share_name():
    name = "weight-sync-tests"
    yield name
    withdraw_policy(name, 0)


def _prompts(encode, seed: int) -> DataProto:
    return DataProto.from_dict(tensors=encode(), meta_info={"seed": seed, "eos_token_id": []})


def _train_once(actor: ActorWorker, batch: DataProto, seed: int) -> None:
    batch.batch[F.OLD_LOG_PROBS] = actor.compute_log_prob(batch).batch[F.OLD_LOG_PROBS]
    batch.batch[F.ADVANTAGES] = torch.randn(
        batch.batch[F.OLD_LOG_PROBS].shape, generator=torch.Generator().manual_seed(seed)
    )
    actor.update_actor(batch)


def _diff(actor: ActorWorker, batch: DataProto) -> float:
    old = actor.compute_log_prob(batch).batch[F.OLD_LOG_PROBS]
    return actor_logprob_diff(batch.batch[F.ROLLOUT_LOG_PROBS], old, batch.batch[F.RESPONSE_MASK])[
        "rollout/actor_logprob_diff"
    ]


@pytest.mark.parametrize("backend", ["naive", "shared", "inproc", "disk"])
def test_each_backend_keeps_the_rollout_on_the_actors_weights(tiny_model_dir, encode, share_name, backend, tmp_path):
    extra = [
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
    ]
    if backend == "disk":
        extra.append(f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={{dir: {tmp_path}}}")
    config = _config(tiny_model_dir, *extra)
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    copies = backend in ("inproc", "disk")
    assert rollout.shares_actor_module == (not copies)
    assert (rollout.rollout.model is actor.module) == (not copies)
    for step in (1, 2):
        batch = rollout.generate_sequences(_prompts(encode, seed=step)).data
        assert _diff(actor, batch) < 1e-5
        _train_once(actor, batch, step)
        metrics = rollout.update_weights(version=step)
        assert rollout.weight_version == step
        if copies:
            assert metrics["weight_sync/version"] == step and metrics["weight_sync/tensors"] > 0
            actor_state = dict(actor.engine.iter_sync_weights())
            own = rollout.rollout.model.state_dict()
            assert all(torch.equal(own[name], tensor) for name, tensor in actor_state.items())
    assert _diff(actor, rollout.generate_sequences(_prompts(encode, seed=9)).data) < 1e-5
    if backend == "disk":
        assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == ["v2"]


def test_an_update_without_a_change_only_stamps_the_version(tiny_model_dir, share_name):
    config = _config(tiny_model_dir, "actor_rollout_ref.rollout.checkpoint_engine.backend=inproc")
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    assert rollout.update_weights(version=1)["weight_sync/tensors"] > 0  # the first sync copies
    assert rollout.update_weights(version=2) == {} and rollout.weight_version == 2


@pytest.fixture
def serve(tiny_model_dir) -> Iterator[tuple[str, object, str]]:
    """``hybridflow serve``'s app on the tiny model folder, with the control routes on (and the
    control token it generated, which the trainer's client sends as its api_key)."""
    pytest.importorskip("fastapi")
    from hybridflow.entrypoints.serve import build_state, parse_args
    from hybridflow.server.app import build_app

    state = build_state(parse_args(["--model", str(tiny_model_dir), "--dtype", "fp32", "--control-routes"]))
    with serve_in_thread(build_app(state)) as url:
        yield url, state.engine, state.control_token


def test_http_backend_generates_on_the_server_and_pushes_the_updates(tiny_model_dir, encode, share_name, serve):
    url, engine, token = serve
    config = _config(
        tiny_model_dir,
        "actor_rollout_ref.rollout.checkpoint_engine.backend=http",
        f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={{url: '{url}', api_key: '{token}'}}",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
    )
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    assert type(rollout.rollout).__name__ == "ServerRollout"
    for step in (1, 2):
        batch = rollout.generate_sequences(_prompts(encode, seed=step)).data
        assert batch.batch[F.RESPONSES].shape[0] == encode()[F.INPUT_IDS].shape[0]
        assert batch.batch[F.RESPONSE_MASK].sum() > 0
        assert _diff(actor, batch) < 1e-4  # the server's own log-probs, from the actor's weights
        _train_once(actor, batch, step)
        metrics = rollout.update_weights(version=step)
        assert engine.weight_version == step and metrics["weight_sync/buckets"] >= 1
    assert _diff(actor, rollout.generate_sequences(_prompts(encode, seed=9)).data) < 1e-4
    rollout.close()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "nccl"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=http", "engine_kwargs.url"),
        ("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={dir: /tmp/x}", "dir"),
        ("actor_rollout_ref.rollout.name=vllm", "vllm"),
    ],
)
def test_config_errors_name_the_problem(tiny_model_dir, override, message, monkeypatch):
    import hybridflow.utils.optional_engines as optional_engines

    monkeypatch.setattr(optional_engines, "engine_available", lambda name: False)
    with pytest.raises(ConfigError, match=message):
        _config(tiny_model_dir, override)


def test_verl_old_bucket_key_moves_to_the_checkpoint_engine(tiny_model_dir):
    config = _config(tiny_model_dir, "actor_rollout_ref.rollout.update_weights_bucket_megabytes=7")
    assert config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 7


def test_partial_rollout_aborts_swaps_and_resumes_the_generation_in_flight(tiny_model_dir, encode, share_name):
    """The sequence a fully-async sync runs: abort the chunk in flight, take the new weights
    while its requests wait, resume them; each response records the versions of its first and
    last tokens, and the resumed part was sampled from the new weights."""
    import threading

    config = _config(
        tiny_model_dir,
        "actor_rollout_ref.rollout.checkpoint_engine.backend=inproc",
        "actor_rollout_ref.rollout.response_length=400",
        "actor_rollout_ref.rollout.ignore_eos=false",
    )
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    rollout.update_weights(version=0)
    rollout.set_pull_before_generating(False)
    rollout.set_partial_rollout(True)
    _train_once(actor, rollout.generate_sequences(_prompts(encode, seed=1)).data, seed=1)  # the actor moves on
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("out", rollout.generate_sequences(_prompts(encode, 2)).data)
    )
    engine = rollout.rollout.engines.engine  # the rollout's one engine, kept from the first call
    assert engine is not None
    before = engine.batcher.stats.tokens_generated
    thread.start()
    while rollout.rollout.live_engine is None or engine.batcher.stats.tokens_generated < before + 16:
        assert thread.is_alive(), "the generation finished before the test could abort it"
    assert rollout.abort_generation() >= 1
    metrics = rollout.update_weights(version=1)
    rollout.resume_generation()
    thread.join(TIMEOUT_S)
    out = result["out"]
    low, high = out.non_tensor_batch[F.WEIGHT_VERSION_MIN], out.non_tensor_batch[F.WEIGHT_VERSION_MAX]
    assert metrics["weight_sync/version"] == 1 and set(low.tolist()) <= {0, -1}
    assert (high == 1).any()  # some responses were resumed on the new weights
    # every token's log-prob is the sampler's own: finite, ≤ 0, zero on padding
    logp, mask = out.batch[F.ROLLOUT_LOG_PROBS], out.batch[F.RESPONSE_MASK]
    assert torch.isfinite(logp).all() and (logp[mask.bool()] <= 0).all() and (logp[~mask.bool()] == 0).all()
