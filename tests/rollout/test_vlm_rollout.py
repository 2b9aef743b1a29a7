"""The built-in rollout on image + text prompts (tiny Qwen2-VL, fp32): verl-layout parquet rows →
RLDataset → ``generate_sequences`` → the actor's ``compute_log_prob`` on the same rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hybridflow import fields as F
from hybridflow.agent.base import refuse_images
from hybridflow.agent.collate import NUM_TURNS
from hybridflow.config import load_config
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.data import RLDataset, collate_fn
from hybridflow.data.multimodal import MULTI_MODAL_DATA
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm
from hybridflow.protocol import DataProto
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.rollout.agent_loop import AgentLoopRollout
from hybridflow.workers.rollout.torch_rollout import TorchRollout, response_positions
from tests.rollout.vlm_rows import write_vlm_parquet

N = 2
RESPONSE = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def prompts(folder, tmp_path_factory) -> DataProto:
    processor = load_processor(folder)
    path = write_vlm_parquet(tmp_path_factory.mktemp("data") / "vl.parquet", 4)
    ds = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=64)
    return DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))


@pytest.fixture(scope="module")
def actor(folder) -> ActorWorker:
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={folder}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        ],
    )
    worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    return worker


def _rollout(actor: ActorWorker, **settings) -> TorchRollout:
    config = replace(RolloutConfig(), response_length=RESPONSE, seed=0, **settings)
    return TorchRollout(config, actor.module, actor.tokenizer, dtype=torch.float32)


def test_response_positions_continue_every_axis_from_the_largest_prompt_position() -> None:
    # one padding column, then positions whose largest (4, on the time axis) is not in the last column
    prompt = torch.tensor([[[0, 0, 1, 4, 3], [0, 0, 1, 2, 3], [0, 0, 1, 3, 3]]])
    out = response_positions(prompt, 3)
    assert out.shape == (1, 3, 3) and out.tolist() == [[[5, 6, 7]] * 3]
    assert response_positions(torch.tensor([[0, 0, 1, 2]]), 2).tolist() == [[3, 4]]


def test_generate_sequences_with_images(actor, prompts) -> None:
    data = prompts.select_idxs(list(range(len(prompts))))
    data.meta_info.update({F.META_N: N, F.META_SEED: 3})
    out = _rollout(actor).generate_sequences(data)
    b, P = len(prompts), prompts.batch[F.INPUT_IDS].shape[1]
    assert out.batch[F.POSITION_IDS].shape == (b * N, 3, P + RESPONSE)
    prompt_pos = prompts.batch[F.POSITION_IDS].repeat_interleave(N, dim=0)
    assert torch.equal(out.batch[F.POSITION_IDS][:, :, :P], prompt_pos)
    start = prompt_pos.amax(dim=(1, 2))
    expected = start[:, None] + torch.arange(1, RESPONSE + 1)[None]
    for axis in range(3):
        assert torch.equal(out.batch[F.POSITION_IDS][:, axis, P:], expected)
    # the image rows' largest position is below their last column + image tokens: a real difference
    assert bool((start < P - 1).any())
    # each response row keeps its prompt's images (the same objects), in the ×n order
    for i in range(b * N):
        for key in (F.MULTI_MODAL_INPUTS, MULTI_MODAL_DATA):
            assert out.non_tensor_batch[key][i] is prompts.non_tensor_batch[key][i // N]
    vision = torch.tensor([512, 513, 514, 515])
    assert not bool(torch.isin(out.batch[F.RESPONSES], vision).any())


def test_sampler_log_probs_match_the_actor(actor, prompts) -> None:
    """The issue's acceptance: fp32, the sampler's log-probs of its own tokens against the
    actor's ``compute_log_prob`` on the same rows (micro-batches of 3 mix rows of several prompts)."""
    data = prompts.select_idxs(list(range(len(prompts))))
    data.meta_info.update({F.META_N: N, F.META_SEED: 11})
    out = _rollout(actor, temperature=1.0, do_sample=True).generate_sequences(data)
    old = actor.compute_log_prob(out).batch[F.OLD_LOG_PROBS]
    mask = out.batch[F.RESPONSE_MASK].bool()
    diff = (old - out.batch[F.ROLLOUT_LOG_PROBS])[mask].abs()
    assert mask.sum() >= len(out) * 2
    print(f"parity: {int(mask.sum())} tokens, max {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}")
    assert float(diff.max()) <= 3e-5 and float(diff.mean()) <= 6e-6, (float(diff.max()), float(diff.mean()))


def test_vision_tokens_are_never_sampled_even_when_the_model_prefers_them(folder, prompts) -> None:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).float().eval()
    with torch.no_grad():  # tied embeddings: the vision tokens' logits dominate
        model.get_input_embeddings().weight[512:516] *= 200.0
    processor = load_processor(folder)
    config = replace(RolloutConfig(), response_length=4, seed=0, do_sample=False)
    rollout = TorchRollout(config, model, processor.tokenizer, dtype=torch.float32)
    data = prompts.select_idxs([0, 1])
    out = rollout.generate_sequences(data)
    assert not bool(torch.isin(out.batch[F.RESPONSES], torch.tensor([512, 513, 514, 515])).any())
    rollout.suppress_token_ids = ()  # the same rollout, unguarded, samples them
    unguarded = rollout.generate_sequences(data)
    assert bool(torch.isin(unguarded.batch[F.RESPONSES], torch.tensor([512, 513, 514, 515])).any())


def _agent_rollout(actor: ActorWorker) -> AgentLoopRollout:
    base = RolloutConfig()
    config = replace(
        base, response_length=RESPONSE, seed=0, do_sample=False, multi_turn=replace(base.multi_turn, enable=True)
    )
    return AgentLoopRollout(config, actor.module, actor.tokenizer, dtype=torch.float32)


def test_single_turn_agent_rows_with_images_go_through_the_agent_engine(actor, prompts) -> None:
    """Greedy: the agent engine (images and 3-D positions per request) answers image rows with the
    plain sampler's tokens and positions; log-probs agree to float rounding (other padding)."""
    data = prompts.select_idxs(list(range(len(prompts))))
    out, metrics = _agent_rollout(actor).generate_with_metrics(data)
    plain = _rollout(actor, do_sample=False).generate_sequences(prompts.select_idxs(list(range(len(prompts)))))
    for key in (F.RESPONSES, F.POSITION_IDS, F.ATTENTION_MASK, F.RESPONSE_MASK):
        assert torch.equal(out.batch[key], plain.batch[key]), key
    diff = (out.batch[F.ROLLOUT_LOG_PROBS] - plain.batch[F.ROLLOUT_LOG_PROBS]).abs().max()
    assert float(diff) < 1e-5
    assert out.non_tensor_batch[NUM_TURNS].tolist() == [2] * len(prompts)
    assert metrics["num_turns/mean"] == 2.0 and metrics["tool_call_counts/max"] == 0.0
    assert out.non_tensor_batch[F.MULTI_MODAL_INPUTS][1] is prompts.non_tensor_batch[F.MULTI_MODAL_INPUTS][1]


def test_loops_that_send_no_images_refuse_image_rows() -> None:
    row = {F.MULTI_MODAL_INPUTS: {"image_grid_thw": torch.tensor([[1, 4, 4]])}}
    with pytest.raises(ValueError, match="my_loop cannot take rows with images: it sends token ids only"):
        refuse_images(row, "my_loop")
    refuse_images({F.MULTI_MODAL_INPUTS: {}}, "my_loop")  # a text row of a multimodal data set passes
