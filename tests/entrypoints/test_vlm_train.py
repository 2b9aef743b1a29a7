"""``hybridflow train`` on a verl-layout parquet with images (tiny Qwen2-VL, 2 GRPO steps): in
this process and on Ray; GAE with a critic on the same rows; what does not take images yet is
refused at start-up by name."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hybridflow.config import ConfigError, load_config
from hybridflow.engine.checkpoint import MODEL_FILE
from hybridflow.entrypoints.train import run
from hybridflow.entrypoints.train_data import build_loaders
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm
from tests.rollout.vlm_rows import write_vlm_parquet

DENSE_REWARD = Path(__file__).parents[1] / "trainer" / "dense_reward.py"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vl_data")
    write_vlm_parquet(root / "train.parquet", 8, seed=0)
    write_vlm_parquet(root / "test.parquet", 4, seed=1)
    return root


def _overrides(folder: Path, data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.train_files=[{data_dir / 'train.parquet'}]",
        f"data.val_files=[{data_dir / 'test.parquet'}]",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={folder}",
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two updates a step: old log-probs are computed
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"custom_reward_function.path={DENSE_REWARD}",
        *extra,
    ]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _check_two_steps(rows: list[dict]) -> None:
    steps = [r for r in rows if r.get("step", 0) >= 1 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["actor/pg_loss"]) and r["response_length/mean"] > 0
        # the sampler and the actor agree on the image rows' log-probs (same weights at each step's start)
        assert r["rollout/actor_logprob_diff"] < 1e-4
    # the reference took the images too: the KL starts near 0 (it is 0 before the first update) and grows
    assert 0.0 <= steps[0]["actor/kl_loss"] < 0.01 and steps[0]["actor/kl_loss"] < steps[1]["actor/kl_loss"]
    assert any("val-core/mean" in r for r in rows)


def test_grpo_on_image_rows_in_process(folder, data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    run(load_config(None, _overrides(folder, data_dir, run_dir)))
    _check_two_steps(_rows(run_dir))


@pytest.mark.ray
def test_grpo_on_image_rows_on_ray(ray_session, folder, data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    run(load_config(None, _overrides(folder, data_dir, run_dir, "trainer.backend=ray", "trainer.n_gpus_per_node=1")))
    _check_two_steps(_rows(run_dir))


def test_gae_with_a_critic_on_image_rows_in_process(folder, data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    extra = (
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=false",  # no reference: the critic is what is tested
        "data.val_files=[]",
        "trainer.val_before_train=false",
        "trainer.save_freq=2",
    )
    run(load_config(None, _overrides(folder, data_dir, run_dir, *extra)))
    steps = [r for r in _rows(run_dir) if r.get("step", 0) >= 1 and "critic/vf_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["critic/vf_loss"]) and r["critic/grad_norm"] > 0
        assert math.isfinite(r["critic/values/mean"]) and r["critic/values/max"] > r["critic/values/min"]
        assert r["rollout/actor_logprob_diff"] < 1e-4
    # the critic's checkpoint holds its vision tower and value head
    saved = load_file(str(run_dir / "global_step_2" / "critic" / MODEL_FILE))
    assert "v_head.weight" in saved and any(name.startswith("backbone.visual.") for name in saved)


def test_tool_agent_asynchronously_on_image_rows(folder, data_dir, tmp_path) -> None:
    """The agent loops carry the rows' images (tool_agent renders them as image parts), and the
    one-step-off trainer generates them on its rollouter thread; sampler and actor agree."""
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    config: {type: native}\n")
    run_dir = tmp_path / "run"
    extra = (
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "data.max_prompt_length=768",  # the tool schema in the system prompt (byte-level tokenizer)
        "async_training.mode=one_step_off",
        "trainer.val_before_train=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one update a step: step 1 is on-policy
    )
    run(load_config(None, _overrides(folder, data_dir, run_dir, *extra)))
    steps = [r for r in _rows(run_dir) if r.get("step", 0) >= 1 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["actor/pg_loss"]) and r["num_turns/min"] >= 2
    # step 1 trains on what the initial weights sampled: the agent engine's log-probs of the image
    # rows are the actor's (step 2 is one version stale and differs)
    assert steps[0]["fully_async/staleness/mean"] == 0 and abs(steps[0]["rollout_corr/k3_kl"]) < 1e-6
    assert steps[1]["fully_async/staleness/mean"] == 1 and steps[1]["rollout_corr/k3_kl"] > 1e-5


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            (
                "actor_rollout_ref.rollout.checkpoint_engine.backend=http",
                "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.url=http://127.0.0.1:1",
            ),
            "checkpoint_engine.backend=http: a served rollout takes token ids only",
        ),
        (
            ("reward_model.enable=true", "reward_model.model.path=unused"),
            "reward_model.enable: reward models do not read the rows' images",
        ),
    ],
)
def test_what_does_not_take_images_is_refused_by_name(folder, data_dir, tmp_path, overrides, message) -> None:
    config = load_config(None, _overrides(folder, data_dir, tmp_path / "run", *overrides))
    processor = load_processor(folder)
    files = "data.train_files and data.val_files have rows with images .'images' column.: "
    with pytest.raises(ConfigError, match=f"{files}(actor_rollout_ref.rollout.)?{message}"):
        build_loaders(config, processor.tokenizer, processor)


def test_videos_are_refused_with_the_row_named(folder, tmp_path) -> None:
    from hybridflow.data.io import write_rows
    from tests.rollout.vlm_rows import vlm_rows

    rows = vlm_rows(2)
    rows[1]["prompt"] = [{"role": "user", "content": "<video>What happens?"}]
    rows[1]["images"] = []
    path = write_rows(rows, tmp_path / "video.parquet")
    config = load_config(
        None, [f"actor_rollout_ref.model.path={folder}", f"data.train_files=[{path}]", "data.val_files=[]"]
    )
    processor = load_processor(folder)
    with pytest.raises(Exception, match="row 1.*videos are not supported yet"):
        build_loaders(config, processor.tokenizer, processor)
